//! The reliability engine, sans-IO: messages in, packets out; packets in,
//! messages out. Time is an argument; the engine reads no clock, makes no
//! system call and holds no unsafe code, so the same code runs over rings in
//! BAR windows, over RDMA, and over a simulated medium in tests.
//!
//! # Driving an engine
//! In the style of quinn-proto, an [`Engine`] is driven by its owner:
//! - [`Engine::send`] queues a message (the engine keeps the caller's buffer
//!   until the peer acknowledges it, and hands it back then);
//! - [`Engine::handle_packet`] feeds it bytes that arrived from the peer;
//! - [`Engine::poll_transmit`] (or [`Engine::poll_transmit_with`]) yields
//!   packets to put on the medium — call it until it returns `None`;
//! - [`Engine::poll_timeout`] says when to call [`Engine::handle_timeout`]
//!   if nothing arrives before then;
//! - [`Engine::poll_event`] yields delivered messages, completed and failed
//!   sends, and changes of the peer's state;
//! - [`Engine::post_recv`] lends caller memory for the next message to be
//!   assembled in (optional: without it, messages arrive in buffers of the
//!   engine's).
//!
//! # Protocol in brief
//! Each message is cut into fragments of `mtu - HEADER_LEN` bytes, one per
//! data packet, numbered by consecutive sequence numbers. Every packet of
//! either kind carries the sender's cumulative and selective acknowledgement
//! and its credit (how far past the acknowledgement it will accept). A
//! receiver NAKs a corrupt packet, naming the transmission serial it must
//! have had (the last intact one plus the corrupt ones since: the medium
//! keeps order), and the sender resends that packet at once; a packet whose
//! acknowledgement does not come is resent after a timeout that backs off.
//! Each side has an epoch; a packet names the sender's epoch and the
//! receiver's as the sender knows it. A side that restarts comes back with a
//! newer epoch, which ends the old session on both sides: nothing of it is
//! delivered into the new one. See `docs/WIRE.md` and `docs/ARCHITECTURE.md`.
// Protocol code: no unsafe, ever (the crate only denies it, for window::mapping).
#![forbid(unsafe_code)]

mod config;
mod error;
mod event;
mod posted;
mod recv;
mod send;
mod serial;
mod stats;

use std::collections::VecDeque;
use std::time::Duration;

pub use config::{ConfigError, EngineConfig, MAX_MTU, MIN_MTU};
pub use error::{LinkError, PacketError, SendError, Violation};
pub use event::{Event, MessageId};
pub use posted::{Delivery, PostId, PostedRecv, RecvTarget};
pub use stats::Stats;

use crate::crc::Crc32c;
use crate::time::Time;
use crate::wire::{self, HEADER_LEN, Packet, PacketKind, ParseLimits, Repr, WireError, flags};
use event::{EventQueue, Queued, queue_delivered};
use recv::{Completed, Payload, Receiver};
use send::Sender;
use serial::serial_lt;

/// One packet ready for the medium: its header (CRC field still zero) and
/// its payload, borrowed from the sender's buffer.
///
/// A link copies the payload to the medium chunk by chunk while taking the
/// CRC of each chunk ([`Transmit::crc_of_header`], then [`Crc32c::update`]
/// per chunk), then writes the header with [`Transmit::header_with_crc`].
/// [`Transmit::write_to`] does all of it into a plain buffer.
#[derive(Debug)]
pub struct Transmit<'a> {
    header: [u8; HEADER_LEN],
    payload: &'a [u8],
    crc: bool,
    ends_burst: bool,
}

impl Transmit<'_> {
    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Never true: a packet always has a header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The payload to copy after the header.
    pub fn payload(&self) -> &[u8] {
        self.payload
    }

    /// Whether this packet carries a CRC (both sides configured with one).
    pub fn has_crc(&self) -> bool {
        self.crc
    }

    /// Whether the engine expects to wait after this packet: a data packet
    /// that asks for an acknowledgement because nothing more may go out
    /// (nothing else queued, or the window full), or a control packet. A
    /// medium that makes several packets visible at once should make this
    /// one visible now rather than after asking for a next packet that
    /// will not come: the peer may be waiting for exactly this one.
    pub fn ends_burst(&self) -> bool {
        self.ends_burst
    }

    /// A CRC already fed with the header's covered bytes; feed it the
    /// payload, then pass `finish()` to [`Transmit::header_with_crc`].
    pub fn crc_of_header(&self) -> Crc32c {
        let mut crc = Crc32c::new();
        crc.update(&self.header[..wire::CRC_COVERED_HEADER_LEN]);
        crc
    }

    /// The header with `crc` filled in (0 when the packet carries no CRC).
    #[inline]
    pub fn header_with_crc(&self, crc: u32) -> [u8; HEADER_LEN] {
        let mut header = self.header;
        let crc = if self.crc { crc } else { 0 };
        header[wire::field::CRC].copy_from_slice(&crc.to_le_bytes());
        header
    }

    /// Writes the whole packet into `out` and returns its length. Panics if
    /// `out` is shorter than [`Transmit::len`].
    pub fn write_to(&self, out: &mut [u8]) -> usize {
        let len = self.len();
        assert!(
            out.len() >= len,
            "buffer of {} bytes < packet of {len}",
            out.len()
        );
        let crc = if self.crc {
            // Copied and checked in one pass where the CPU allows.
            let mut crc = self.crc_of_header();
            crc.copy_checked(self.payload, &mut out[HEADER_LEN..len], false);
            crc.finish()
        } else {
            out[HEADER_LEN..len].copy_from_slice(self.payload);
            0
        };
        out[..HEADER_LEN].copy_from_slice(&self.header_with_crc(crc));
        len
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// `close` was called: finish sending, then say goodbye.
    Closing,
    Closed,
}

/// One side of a reliable, ordered, checksummed message link.
///
/// `B` is the type of the caller's message buffers (`Vec<u8>`, `Arc<[u8]>`,
/// a registered-memory handle): the engine holds each until the peer
/// acknowledges it and then returns it in [`Event::SendComplete`].
#[derive(Debug)]
pub struct Engine<B = Vec<u8>> {
    config: EngineConfig,
    limits: ParseLimits,
    epoch: u32,
    peer_epoch: Option<u32>,
    state: State,
    close_packet_pending: bool,
    sender: Sender<B>,
    receiver: Receiver,
    events: EventQueue<B>,
    stats: Stats,
    /// Serial for the next packet sent, of any kind (starts at 1: a NAK
    /// naming 0 means "nothing intact arrived yet").
    next_xmit: u32,
    last_sent: Option<Time>,
    last_heard: Time,
    /// The peer's earlier epochs: packets from them are leftovers even if
    /// serial arithmetic would call them newer after many restarts.
    retired_peer_epochs: VecDeque<u32>,
    /// Where a payload that cannot go straight into its message is copied
    /// for [`Engine::handle_packet_from`].
    scratch: Vec<u8>,
}

/// Earlier peer epochs remembered.
const RETIRED_EPOCHS_KEPT: usize = 16;

impl<B: AsRef<[u8]>> Engine<B> {
    /// Creates an engine for one side of a link.
    ///
    /// `epoch` names this incarnation of this side: nonzero, and newer (in
    /// serial-number order, RFC 1982) each time the side restarts, so the
    /// peer can tell a restart from a late packet. Take it from a counter
    /// that goes up by one per restart (links keep one in the ring's control
    /// block); the peer also remembers the last 16 epochs it retired.
    pub fn new(config: EngineConfig, epoch: u32, now: Time) -> Result<Self, ConfigError> {
        config.validate()?;
        if epoch == 0 {
            return Err(ConfigError::Zero { name: "epoch" });
        }
        Ok(Engine {
            limits: config.parse_limits(),
            sender: Sender::new(&config),
            receiver: Receiver::default(),
            config,
            epoch,
            peer_epoch: None,
            state: State::Open,
            close_packet_pending: false,
            events: EventQueue::new(),
            stats: Stats::default(),
            next_xmit: 1,
            last_sent: None,
            last_heard: now,
            retired_peer_epochs: VecDeque::new(),
            scratch: Vec::new(),
        })
    }

    /// The configuration it was created with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// This side's epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The peer's epoch, once it has been heard from.
    pub fn peer_epoch(&self) -> Option<u32> {
        self.peer_epoch
    }

    /// Whether the peer has been heard from and the link is not closed.
    pub fn is_connected(&self) -> bool {
        self.peer_epoch.is_some() && self.state != State::Closed
    }

    /// Whether the link has ended ([`Event::Closed`] was or will be emitted).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Counters since creation.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Whether a queued message has packets that were never sent (waiting
    /// for the window, the peer's credit or [`Engine::poll_transmit`]).
    pub fn has_unsent(&self) -> bool {
        self.sender.has_unsent()
    }

    /// Makes queued message `id` ask for an acknowledgement also on its
    /// packet a full payload or more before its end, so that a sender that
    /// waits for the message learns, while the last packets are still on
    /// their way, that only they are unacknowledged ([`Engine::needed_from`]):
    /// a blocking send that lends its caller's bytes copies those and
    /// returns instead of idling while the peer checks them. Call before
    /// that packet goes out (right after [`Engine::send`]); whether it
    /// will be asked (not for a message under two full packets). One
    /// acknowledgement more for the message.
    pub fn ack_before_tail(&mut self, id: MessageId) -> bool {
        self.sender.ack_before_tail(id.0)
    }

    /// The offset of the first byte of queued message `id` that this side
    /// may still read from its buffer, to send it or send it again; `None`
    /// once it is not queued (acknowledged, or failed). It only grows, so
    /// a value read earlier stays true. The buffer may then be replaced by
    /// one holding only the bytes from that offset on (through interior
    /// mutability: the engine holds it): a buffer shorter than its message
    /// is read as the message's last bytes.
    pub fn needed_from(&self, id: MessageId) -> Option<u64> {
        self.sender.needed_from(id.0)
    }

    /// Whether the packet before a message's tail asked for an
    /// acknowledgement ([`Engine::ack_before_tail`]) that has not gone out
    /// and may not wait for an answer to carry it: the sender waits for it
    /// to learn what of the message it still needs. A medium that takes
    /// packets in batches sends it before it checks the next ones, the
    /// message's last among them.
    pub fn before_tail_ack_due(&self, now: Time) -> bool {
        self.receiver.owes_ack_before_tail() && !self.receiver.may_hold_ack(now, &self.config)
    }

    /// Messages queued and not yet acknowledged.
    pub fn queued_messages(&self) -> usize {
        self.sender.queued_messages()
    }

    /// Bytes the receiving side holds: buffered ahead of a gap, being
    /// assembled, or delivered and not yet taken. Bounded by configuration.
    pub fn buffered_bytes(&self) -> usize {
        self.receiver.buffered_bytes()
    }

    /// Bytes of the delivered messages not yet taken.
    pub fn ready_bytes(&self) -> usize {
        self.receiver.undelivered_bytes
    }

    /// Whether data from the peer waits for this side's caller (buffered
    /// ahead of a gap, being assembled, or delivered and not yet taken):
    /// it holds credit this side granted, so the peer may be waiting for
    /// the caller to receive.
    pub fn holds_unreceived(&self) -> bool {
        self.receiver.holds_data() || self.messages_ready() > 0
    }

    /// Queues a message for sending. The engine keeps `buf` until the peer
    /// acknowledges the whole message ([`Event::SendComplete`]) or the
    /// session ends ([`Event::SendFailed`]).
    pub fn send(&mut self, buf: B) -> Result<MessageId, SendError<B>> {
        if self.state != State::Open {
            return Err(SendError::Closed(buf));
        }
        let len = buf.as_ref().len() as u64;
        if len > self.config.max_message_len {
            return Err(SendError::TooLong {
                buf,
                len,
                max: self.config.max_message_len,
            });
        }
        if self.sender.queued_messages() >= self.config.send_queue_limit {
            return Err(SendError::QueueFull(buf));
        }
        Ok(MessageId(self.sender.enqueue(buf)))
    }

    /// Begins an orderly close: queued messages are still sent; once all are
    /// acknowledged a Close packet tells the peer, and [`Event::Closed`]
    /// with [`LinkError::LocalClose`] follows. Sends are refused from now.
    pub fn close(&mut self) {
        if self.state == State::Open {
            self.state = State::Closing;
        }
    }

    /// Feeds one packet that arrived from the peer.
    ///
    /// An `Err` means the packet was dropped, and why; the engine has already
    /// counted it and, for a packet that failed the wire checks, arranged a
    /// NAK (within a budget that only intact packets refill, so two sides
    /// that garble each other do not trade NAKs forever). Only a
    /// [`PacketError::Violation`] ends the link (with [`Event::Closed`]).
    pub fn handle_packet(&mut self, now: Time, bytes: &[u8]) -> Result<(), PacketError> {
        self.stats.bytes_received += bytes.len() as u64;
        if self.state == State::Closed {
            return Err(PacketError::EngineClosed);
        }
        let packet = Packet::new_unchecked(bytes);
        match Repr::parse(&packet, &self.limits) {
            Ok(repr) => self.accept(now, &repr, Payload::Bytes(packet.payload())),
            Err(error) => Err(self.on_wire_error(error)),
        }
    }

    /// Feeds one packet straight out of the medium, copying its payload
    /// exactly once: [`Engine::handle_packet`] for a packet that is not
    /// contiguous in memory yet.
    ///
    /// `header` holds the packet's first [`HEADER_LEN`] bytes; at most
    /// `room` payload bytes can follow it (a ring slot's size less the
    /// packet's lead and header). `read_payload(offset, dst, crc, message_len)` copies
    /// `dst.len()` payload bytes starting at `offset` out of the medium
    /// and, when `crc` is `Some`, feeds the bytes as they landed in `dst`
    /// into it (a window does both in one pass:
    /// [`crate::window::Window::read_crc`]); `message_len` is the length of
    /// the message `dst` belongs to, or of the whole buffer its posted
    /// target is a range of when that is longer
    /// ([`RecvTarget::buffer_len`]), or 0 when `dst` is scratch space the
    /// engine reads back at once (a medium may write a large message's
    /// bytes around the cache). When the packet is the next one in order
    /// of the message being put together — the common case — the bytes
    /// land directly in that message's buffer; otherwise in a scratch
    /// buffer. Nothing counts as received until the CRC matches: a corrupt
    /// payload copied into a message's buffer is overwritten by the
    /// retransmission.
    ///
    /// The outer `Err` is the medium's error, returned as soon as
    /// `read_payload` fails (the packet is then dropped uncounted); the inner
    /// result is [`Engine::handle_packet`]'s.
    pub fn handle_packet_from<E>(
        &mut self,
        now: Time,
        header: &[u8],
        room: usize,
        mut read_payload: impl FnMut(usize, &mut [u8], Option<&mut Crc32c>, u64) -> Result<(), E>,
    ) -> Result<Result<(), PacketError>, E> {
        if self.state == State::Closed {
            self.stats.bytes_received += header.len().min(HEADER_LEN) as u64;
            return Ok(Err(PacketError::EngineClosed));
        }
        let repr = match Repr::parse_header(header, room, &self.limits) {
            Ok(repr) => repr,
            Err(error) => {
                self.stats.bytes_received += header.len().min(HEADER_LEN) as u64;
                return Ok(Err(self.on_wire_error(error)));
            }
        };
        let payload_len = repr.payload_len as usize;
        self.stats.bytes_received += (HEADER_LEN + payload_len) as u64;
        let mut crc = repr.crc_to_verify(&self.limits).then(|| {
            let mut crc = Crc32c::new();
            crc.update(&header[..wire::CRC_COVERED_HEADER_LEN]);
            crc
        });
        // Only a data packet of the current session can go straight into
        // its message: anything else may reset or close the receiver first.
        let in_session = repr.kind == PacketKind::Data
            && repr.peer_epoch == self.epoch
            && self.peer_epoch == Some(repr.epoch);
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut medium_error = None;
        let lent_buffer_len = match &repr.fragment {
            Some(fragment) if in_session => self.receiver.landing_buffer_len(fragment.msg_id),
            _ => 0,
        };
        let placed = {
            let placement = if in_session {
                self.receiver.place(&repr, &self.config)
            } else {
                None
            };
            let placed = placement.is_some();
            // Only data packets, which carry a fragment, are placed.
            let message_len = match (&placement, &repr.fragment) {
                (Some(_), Some(fragment)) => fragment.msg_len.max(lent_buffer_len),
                _ => 0,
            };
            let dst = match placement {
                Some(dst) => dst,
                None => {
                    // `read_payload` writes every byte before any is read:
                    // only bytes never used before are zeroed, not every
                    // packet's (a combining target's packets all come here).
                    if scratch.len() < payload_len {
                        scratch.resize(payload_len, 0);
                    }
                    &mut scratch[..payload_len]
                }
            };
            if !dst.is_empty()
                && let Err(error) = read_payload(0, dst, crc.as_mut(), message_len)
            {
                medium_error = Some(error);
            }
            placed
        };
        if let Some(error) = medium_error {
            self.scratch = scratch;
            return Err(error);
        }
        if let Some(crc) = crc {
            let carried = Packet::new_unchecked(header).crc();
            let computed = crc.finish();
            if computed != carried {
                self.scratch = scratch;
                return Ok(Err(
                    self.on_wire_error(WireError::BadCrc { carried, computed })
                ));
            }
        }
        let payload = if placed {
            Payload::Placed(payload_len)
        } else {
            Payload::Bytes(&scratch[..payload_len])
        };
        let result = self.accept(now, &repr, payload);
        self.scratch = scratch;
        Ok(result)
    }

    /// Counts a packet that failed the wire checks and arranges its NAK.
    fn on_wire_error(&mut self, error: WireError) -> PacketError {
        if error.is_corruption() {
            self.stats.crc_failures += 1;
        } else {
            self.stats.malformed += 1;
        }
        // On a medium that keeps order, what arrived corrupt is what the
        // peer sent right after the last intact packet.
        self.receiver.on_corrupt();
        error.into()
    }

    /// Acts on a packet that passed the wire checks.
    #[inline]
    fn accept(&mut self, now: Time, repr: &Repr, payload: Payload<'_>) -> Result<(), PacketError> {
        let repr = *repr;
        if repr.peer_epoch != 0 && repr.peer_epoch != self.epoch {
            // Addressed to another incarnation of this side: left over from
            // before this side (re)started. Learn nothing from it, least of
            // all the peer's epoch.
            self.stats.stale += 1;
            return Err(PacketError::Misaddressed {
                addressed_to: repr.peer_epoch,
                mine: self.epoch,
            });
        }
        self.check_peer_epoch(&repr)?;
        self.stats.packets_received += 1;
        self.receiver.on_intact(repr.xmit);
        if repr.peer_epoch != self.epoch {
            // The peer does not know this incarnation yet: its ack fields
            // describe another session and its data is not for us. Answer a
            // hello at once so that it learns our epoch; anything else waits
            // for our next heartbeat, so that two sides that cannot hear each
            // other never trade packets in a tight loop.
            if repr.kind == PacketKind::Heartbeat {
                self.receiver.ack_now = true;
            }
            return match repr.kind {
                PacketKind::Data | PacketKind::Nak | PacketKind::Close => {
                    Err(PacketError::Misaddressed {
                        addressed_to: repr.peer_epoch,
                        mine: self.epoch,
                    })
                }
                PacketKind::Ack | PacketKind::Heartbeat => Ok(()),
            };
        }
        // Liveness means the peer hears *this* side: a peer that only ever
        // sends hellos (a path broken one way) is as lost as a silent one.
        self.last_heard = now;
        let events = &mut self.events;
        let stats = &mut self.stats;
        self.sender.on_ack(
            now,
            repr.ack,
            repr.sack,
            repr.credit,
            &self.config,
            |message| {
                stats.messages_sent += 1;
                events.push_back(Queued {
                    event: Event::SendComplete {
                        id: MessageId(message.id),
                        buf: message.buf,
                    },
                    packets: 0,
                    bytes: 0,
                });
            },
        )?;
        match repr.kind {
            PacketKind::Data => {
                let result = self.receiver.on_data(
                    now,
                    &repr,
                    payload,
                    &self.config,
                    &mut self.stats,
                    |completed: Completed| {
                        queue_delivered(&mut self.events, completed);
                    },
                );
                let fatal = match &result {
                    Err(PacketError::Violation { seq, detail }) => {
                        Some(LinkError::ProtocolViolation {
                            seq: *seq,
                            detail: *detail,
                        })
                    }
                    Err(PacketError::OutOfMemory { msg_id, bytes, .. }) => {
                        Some(LinkError::OutOfMemory {
                            msg_id: *msg_id,
                            bytes: *bytes,
                        })
                    }
                    _ => None,
                };
                if let Some(reason) = fatal {
                    self.fail(reason);
                    // Tell the peer we hung up rather than let it time out.
                    self.close_packet_pending = true;
                }
                result
            }
            PacketKind::Nak => {
                self.stats.naks_received += 1;
                // The parser cannot know the kind-specific range: a NAK names
                // a 32-bit transmission serial.
                if let Ok(corrupt_xmit) = u32::try_from(repr.seq)
                    && let Err(error) = self.sender.on_nak(corrupt_xmit, &self.config)
                {
                    self.fail(error);
                    self.close_packet_pending = true;
                }
                Ok(())
            }
            PacketKind::Close => {
                self.fail(LinkError::PeerClosed);
                Ok(())
            }
            PacketKind::Ack | PacketKind::Heartbeat => Ok(()),
        }
    }

    /// Learns the peer's epoch, or detects its restart, or rejects a stale
    /// packet.
    fn check_peer_epoch(&mut self, repr: &Repr) -> Result<(), PacketError> {
        match self.peer_epoch {
            None => {
                self.peer_epoch = Some(repr.epoch);
                self.receiver.ack_now = true;
                self.push_event(Event::Connected {
                    peer_epoch: repr.epoch,
                });
            }
            Some(current) if repr.epoch == current => {}
            // Only a strictly newer epoch (RFC 1982) that was never seen
            // before is a restart; anything else — older, exactly half the
            // number space away, or retired — is a leftover.
            Some(current)
                if !serial_lt(current, repr.epoch)
                    || self.retired_peer_epochs.contains(&repr.epoch) =>
            {
                self.stats.stale += 1;
                return Err(PacketError::StaleEpoch {
                    epoch: repr.epoch,
                    current,
                });
            }
            Some(old_epoch) => {
                if self.retired_peer_epochs.len() == RETIRED_EPOCHS_KEPT {
                    self.retired_peer_epochs.pop_front();
                }
                self.retired_peer_epochs.push_back(old_epoch);
                let new_epoch = repr.epoch;
                self.stats.peer_restarts += 1;
                self.push_event(Event::PeerRestarted {
                    old_epoch,
                    new_epoch,
                });
                self.end_session(LinkError::PeerRestarted {
                    old_epoch,
                    new_epoch,
                });
                self.peer_epoch = Some(new_epoch);
                self.receiver.ack_now = true;
            }
        }
        Ok(())
    }

    /// Fails every unacknowledged message and resets both halves.
    fn end_session(&mut self, error: LinkError) {
        for message in self.sender.drain_all() {
            self.events.push_back(Queued {
                event: Event::SendFailed {
                    id: MessageId(message.id),
                    buf: message.buf,
                    error: error.clone(),
                },
                packets: 0,
                bytes: 0,
            });
        }
        self.receiver.reset();
    }

    /// Ends the link for good.
    fn fail(&mut self, reason: LinkError) {
        if self.state == State::Closed {
            return;
        }
        self.end_session(reason.clone());
        self.state = State::Closed;
        self.push_event(Event::Closed { reason });
    }

    fn push_event(&mut self, event: Event<B>) {
        self.events.push_back(Queued {
            event,
            packets: 0,
            bytes: 0,
        });
    }

    /// Processes timers that are due: retransmissions and peer loss. Call it
    /// at [`Engine::poll_timeout`] (calling it early or often is harmless).
    pub fn handle_timeout(&mut self, now: Time) {
        if self.state == State::Closed {
            return;
        }
        let silent_for = now.saturating_duration_since(self.last_heard);
        if silent_for >= self.config.peer_timeout {
            self.fail(LinkError::PeerLost { silent_for });
            return;
        }
        if let Err(error) = self.sender.on_timeout(now, &self.config) {
            self.fail(error);
            self.close_packet_pending = true;
        }
    }

    /// When [`Engine::handle_timeout`] should next be called if nothing
    /// arrives and nothing is sent; `None` once the link has ended.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.state == State::Closed {
            return None;
        }
        let keepalive = match self.last_sent {
            None => self.last_heard, // say hello at once
            Some(sent) => sent + self.keepalive_interval(),
        };
        [
            Some(keepalive),
            Some(self.last_heard + self.config.peer_timeout),
            self.sender.next_deadline(),
            self.receiver.ack_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Heartbeats keep an idle link alive; before the peer is known they are
    /// hellos and repeat at the initial retransmission timeout.
    fn keepalive_interval(&self) -> Duration {
        if self.peer_epoch.is_some() {
            self.config.heartbeat_interval
        } else {
            self.config.initial_rto
        }
    }

    /// Whether [`Engine::poll_transmit`] has something to send now.
    pub fn wants_transmit(&self, now: Time) -> bool {
        self.next_kind(now).is_some()
    }

    fn next_kind(&self, now: Time) -> Option<PacketKind> {
        if self.state == State::Closed {
            return self.close_packet_pending.then_some(PacketKind::Close);
        }
        if self.receiver.nak_pending() {
            return Some(PacketKind::Nak);
        }
        if self.peer_epoch.is_some() && self.sender.wants_to_send(&self.config) {
            return Some(PacketKind::Data);
        }
        control_due(
            &self.receiver,
            &self.config,
            now,
            self.last_sent,
            self.keepalive_interval(),
        )
    }

    /// Produces the next packet to send, if any, and hands it to `write`
    /// while the payload is borrowed from the caller's buffer. Call until
    /// it returns `None`.
    pub fn poll_transmit_with<R>(
        &mut self,
        now: Time,
        write: impl FnOnce(&Transmit<'_>) -> R,
    ) -> Option<R> {
        if self.state == State::Closing && self.sender.is_idle() {
            self.state = State::Closed;
            self.close_packet_pending = true;
            self.push_event(Event::Closed {
                reason: LinkError::LocalClose,
            });
        }
        let xmit = self.next_xmit;
        let keepalive = self.keepalive_interval();
        let mut packet_flags = if self.config.crc { 0 } else { flags::NO_CRC };
        let mut seq = 0;
        let mut fragment = None;
        let mut payload: &[u8] = &[];
        // Priority: the goodbye, a NAK (the peer's resend waits on it), data,
        // then an ack or heartbeat. The sender is asked once: it picks the
        // packet and lends its payload in the same step.
        let kind = if self.state == State::Closed {
            if !self.close_packet_pending {
                return None;
            }
            self.close_packet_pending = false;
            PacketKind::Close
        } else if let Some(nak) = self.receiver.take_nak() {
            seq = u64::from(nak);
            self.stats.naks_sent += 1;
            PacketKind::Nak
        } else if self.peer_epoch.is_some()
            && let Some(data) =
                self.sender
                    .next_transmission(now, xmit, &self.config, &mut self.stats)
        {
            seq = data.packet.seq;
            fragment = Some(data.packet.fragment);
            if data.packet.ack_requested {
                packet_flags |= flags::ACK_REQUESTED;
            }
            if data.packet.retransmission {
                packet_flags |= flags::RETRANSMISSION;
            }
            payload = data.payload;
            self.stats.data_packets_sent += 1;
            self.stats.payload_bytes_sent += payload.len() as u64;
            PacketKind::Data
        } else {
            let kind = control_due(&self.receiver, &self.config, now, self.last_sent, keepalive)?;
            match kind {
                PacketKind::Ack => self.stats.acks_sent += 1,
                _ => self.stats.heartbeats_sent += 1,
            }
            kind
        };
        self.next_xmit = self.next_xmit.wrapping_add(1).max(1);
        let credit = self.receiver.credit(&self.config);
        let payload_len = payload.len() as u32;
        let repr = Repr {
            kind,
            flags: packet_flags,
            epoch: self.epoch,
            peer_epoch: self.peer_epoch.unwrap_or(0),
            seq,
            ack: self.receiver.ack(),
            sack: self.receiver.sack(),
            credit,
            xmit,
            fragment,
            payload_len,
        };
        let mut header = [0u8; HEADER_LEN];
        repr.emit_header(&mut header);
        self.receiver.on_ack_sent(credit);
        self.last_sent = Some(now);
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += repr.buffer_len() as u64;
        let transmit = Transmit {
            header,
            payload,
            crc: self.config.crc,
            ends_burst: kind != PacketKind::Data || packet_flags & flags::ACK_REQUESTED != 0,
        };
        Some(write(&transmit))
    }

    /// Writes the next packet to send, if any, into `out` (at least `mtu`
    /// bytes) and returns its length. Call until it returns `None`.
    pub fn poll_transmit(&mut self, now: Time, out: &mut [u8]) -> Option<usize> {
        self.poll_transmit_with(now, |transmit| transmit.write_to(out))
    }

    /// Gives back the buffer of a delivered message (from
    /// [`Event::Message`]) so that a later message is assembled in it:
    /// no allocation, and no page faults on fresh memory, per message.
    /// Optional; a few buffers are kept, the rest dropped.
    pub fn recycle_buffer(&mut self, buf: Vec<u8>) {
        self.receiver.recycle(buf, &self.config);
    }

    /// The next event, if any. Taking a delivered message frees the credit
    /// its packets held, and releases an acknowledgement held back so that
    /// a reply could carry it: call [`Engine::poll_transmit`] afterwards.
    pub fn poll_event(&mut self) -> Option<Event<B>> {
        let queued = self.events.pop_front()?;
        Some(self.take(queued))
    }

    /// The next delivered message, skipping other events (which stay
    /// queued for [`Engine::poll_other_event`]). Like `poll_event`, taking
    /// it frees its credit. A message that landed in a posted target comes
    /// as a copy, and the target is dropped: a caller that posts targets
    /// takes messages with [`Engine::poll_delivery`].
    pub fn poll_message(&mut self) -> Option<(MessageId, Vec<u8>)> {
        match self.poll_delivery()? {
            Delivery::Message { id, data } => Some((id, data)),
            Delivery::Landed { id, mut recv, len } => Some((id, recv.bytes_mut()[..len].to_vec())),
        }
    }

    /// The next delivered message, wherever it landed (see
    /// [`Engine::post_recv`]); as [`Engine::poll_message`] otherwise.
    #[inline]
    pub fn poll_delivery(&mut self) -> Option<Delivery> {
        let (_, queued) = self.events.messages.pop_front()?;
        match self.take(queued) {
            Event::Message { id, data } => Some(Delivery::Message { id, data }),
            Event::Landed { id, recv, len } => Some(Delivery::Landed { id, recv, len }),
            _ => unreachable!("the message queue holds only messages"),
        }
    }

    /// Lends `target` for a message to land in: the next message that
    /// starts in order while it is the first target posted, and fits it,
    /// is assembled in it and delivered as [`Event::Landed`] (or
    /// [`Delivery::Landed`]); nothing is copied again on its way to the
    /// caller. Targets are taken in the order posted, one per message. A
    /// message that does not fit the first target, or began before it was
    /// posted (or ahead of a gap, after a loss), arrives in a buffer of the
    /// engine's as before, and the target stays posted: a caller that
    /// wants every message in its targets copies such a one itself.
    ///
    /// A combining target ([`RecvTarget::combines`]) is taken only by the
    /// message it names, and only while it is the first target posted;
    /// each packet of that message is folded into it once its CRC passed
    /// (see [`Engine::next_message_id`] for the id to name). After a peer
    /// restart no combining target posted before it takes a message.
    pub fn post_recv(&mut self, target: Box<dyn RecvTarget>) -> PostId {
        self.receiver.post(target)
    }

    /// Takes back posted target `id`, unless it was handed over already
    /// (with its message, by [`Engine::poll_delivery`] or
    /// [`Engine::poll_event`]). A message being assembled in it moves to a
    /// buffer of the engine's and goes on arriving; one delivered in it
    /// and not yet taken is copied out and stays first in line, in order.
    /// A combining target's message cannot be copied out: taken back while
    /// it arrives, the rest of it is dropped; taken back once delivered,
    /// it is taken with the target (it is all in the caller's memory).
    /// After this returns, the engine never touches the target again.
    pub fn unpost_recv(&mut self, id: PostId) -> Option<PostedRecv> {
        if let Some(posted) = self.receiver.unpost(id) {
            return Some(posted);
        }
        for at in 0..self.events.messages.len() {
            let (_, queued) = &mut self.events.messages[at];
            let landed_here =
                matches!(&queued.event, Event::Landed { recv, .. } if recv.id() == id);
            if !landed_here {
                continue;
            }
            if matches!(&queued.event, Event::Landed { recv, .. } if recv.is_combining()) {
                let (_, queued) = self.events.messages.remove(at)?;
                let Event::Landed { recv, .. } = self.take(queued) else {
                    unreachable!("checked above")
                };
                return Some(recv);
            }
            let placeholder = Event::Message {
                id: MessageId(0),
                data: Vec::new(),
            };
            let Event::Landed { id, mut recv, len } =
                std::mem::replace(&mut queued.event, placeholder)
            else {
                unreachable!("checked above")
            };
            let data = recv.bytes_mut()[..len].to_vec();
            queued.event = Event::Message { id, data };
            return Some(recv);
        }
        None
    }

    /// Takes back every posted target not handed over yet (see
    /// [`Engine::unpost_recv`]): what an owner calls before it gives the
    /// engine away (to close it elsewhere) while the targets' memory is
    /// to be released.
    pub fn unpost_all(&mut self) -> Vec<PostedRecv> {
        let mut ids = self.receiver.posted_ids();
        for (_, queued) in &self.events.messages {
            if let Event::Landed { recv, .. } = &queued.event {
                ids.push(recv.id());
            }
        }
        ids.into_iter()
            .filter_map(|id| self.unpost_recv(id))
            .collect()
    }

    /// Targets posted and not yet holding a delivered message.
    pub fn posted_recvs(&self) -> usize {
        self.receiver.posted_count()
    }

    /// The next event that is not a delivered message. Delivered messages
    /// stay queued — and keep holding the credit their packets used, so a
    /// caller that is slow to receive slows the sender down — until
    /// [`Engine::poll_message`] or [`Engine::poll_event`] takes them.
    #[inline]
    pub fn poll_other_event(&mut self) -> Option<Event<B>> {
        let (_, queued) = self.events.others.pop_front()?;
        Some(self.take(queued))
    }

    /// Delivered messages waiting for the caller.
    pub fn messages_ready(&self) -> usize {
        self.events.messages.len()
    }

    /// The id of the next message the caller will be handed: the oldest
    /// delivered and not yet taken, else the one arriving, else the next in
    /// order. `None` before the session's first message. The message `n`
    /// after it carries this id plus `n` (wrapping), while the session
    /// lasts and no message is dropped (a combining target taken back, see
    /// [`Engine::unpost_recv`]): what a caller names when it posts
    /// targets ahead that name their messages (`RecvTarget::message`,
    /// `RecvTarget::combines`). Messages of a session the peer ended by
    /// restarting may still wait before the new session's, whose ids start
    /// again: a caller that names messages checks the peer's epoch.
    pub fn next_message_id(&self) -> Option<MessageId> {
        if let Some((_, queued)) = self.events.messages.front() {
            return match &queued.event {
                Event::Message { id, .. } | Event::Landed { id, .. } => Some(*id),
                _ => unreachable!("the message queue holds only messages"),
            };
        }
        self.receiver.next_in_order().map(MessageId)
    }

    fn take(&mut self, queued: Queued<B>) -> Event<B> {
        match queued.event {
            Event::Message { .. } => self.stats.messages_delivered += 1,
            Event::Landed { ref recv, .. } => {
                self.stats.messages_delivered += 1;
                self.stats.messages_landed += 1;
                self.stats.messages_combined += u64::from(recv.is_combining());
            }
            _ => {}
        }
        if queued.packets > 0 || queued.bytes > 0 {
            self.receiver
                .on_taken(queued.packets, queued.bytes, &self.config);
        }
        queued.event
    }
}

/// The control packet due now when no data goes: an ack the receiver owes
/// and may not hold back, else a heartbeat once `keepalive` has passed since
/// the last packet of any kind. A free function so that it can run while
/// the sender lends a payload.
#[inline]
fn control_due(
    receiver: &Receiver,
    config: &EngineConfig,
    now: Time,
    last_sent: Option<Time>,
    keepalive: Duration,
) -> Option<PacketKind> {
    if receiver.wants_ack(now, config) && !receiver.may_hold_ack(now, config) {
        return Some(PacketKind::Ack);
    }
    let keepalive_due = last_sent.is_none_or(|sent| now >= sent + keepalive);
    keepalive_due.then_some(PacketKind::Heartbeat)
}
