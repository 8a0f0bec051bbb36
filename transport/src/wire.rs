//! The packet wire format: an 80-byte header, the payload, and a CRC-32C
//! over both.
//!
//! In the manner of smoltcp's `wire` module, [`Packet`] is a view over bytes
//! with checked accessors for each field, and [`Repr`] is the parsed,
//! validated header that the engine works with ([`Repr::parse`] /
//! [`Repr::emit`]). Every length, index and count in a packet was written by
//! a peer and is untrusted: [`Repr::parse`] checks each against the buffer it
//! arrived in and the configured limits before anything uses it, and each
//! malformed case has its own [`WireError`] variant.
//!
//! `docs/WIRE.md` has the byte diagram; this module is its definition.
//! All integers are little-endian (every host and GPU we target is).
// Protocol code: no unsafe, ever (the crate only denies it, for window::mapping).
#![forbid(unsafe_code)]

use std::fmt;

use crate::crc::Crc32c;

/// `b"BLNK"` read as a little-endian `u32`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"BLNK");
/// The only protocol version this build speaks.
pub const VERSION: u8 = 1;
/// Bytes in a header; the payload follows at this offset.
pub const HEADER_LEN: usize = 80;
/// Bytes of header covered by the CRC before the payload is (the CRC field
/// itself is the header's last four bytes).
pub const CRC_COVERED_HEADER_LEN: usize = field::CRC.start;

/// Byte ranges of the header fields.
pub mod field {
    use std::ops::Range;

    /// A field's byte range within the header.
    pub type Field = Range<usize>;

    pub const MAGIC: Field = 0..4;
    pub const VERSION: usize = 4;
    pub const KIND: usize = 5;
    pub const FLAGS: Field = 6..8;
    pub const EPOCH: Field = 8..12;
    pub const PEER_EPOCH: Field = 12..16;
    pub const SEQ: Field = 16..24;
    pub const ACK: Field = 24..32;
    pub const SACK: Field = 32..40;
    pub const MSG_ID: Field = 40..48;
    pub const MSG_LEN: Field = 48..56;
    pub const FRAG_INDEX: Field = 56..60;
    pub const FRAG_COUNT: Field = 60..64;
    pub const XMIT: Field = 64..68;
    pub const CREDIT: Field = 68..72;
    pub const PAYLOAD_LEN: Field = 72..76;
    pub const CRC: Field = 76..80;
    /// The payload, up to the length in `PAYLOAD_LEN`.
    pub const PAYLOAD_START: usize = 80;
}

/// What a packet is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PacketKind {
    /// One fragment of a message.
    Data = 1,
    /// Acknowledgement state and credit, nothing else.
    Ack = 2,
    /// "Transmission N arrived corrupt": resend it.
    Nak = 3,
    /// Liveness (and, before the peer is known, a hello).
    Heartbeat = 4,
    /// The sender is done with the link.
    Close = 5,
}

impl PacketKind {
    fn from_u8(value: u8) -> Option<PacketKind> {
        Some(match value {
            1 => PacketKind::Data,
            2 => PacketKind::Ack,
            3 => PacketKind::Nak,
            4 => PacketKind::Heartbeat,
            5 => PacketKind::Close,
            _ => return None,
        })
    }
}

impl fmt::Display for PacketKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PacketKind::Data => "data",
            PacketKind::Ack => "ack",
            PacketKind::Nak => "nak",
            PacketKind::Heartbeat => "heartbeat",
            PacketKind::Close => "close",
        })
    }
}

/// Header flag bits.
pub mod flags {
    /// The sender asks for an acknowledgement now rather than after the
    /// receiver's ack delay: set on a new data packet after which the sender
    /// may send nothing more (nothing queued, or window or credit full), and
    /// on every retransmission.
    pub const ACK_REQUESTED: u16 = 1 << 0;
    /// This data packet is a retransmission (diagnostics only).
    pub const RETRANSMISSION: u16 = 1 << 1;
    /// The CRC field is not checked: both sides were configured without CRC
    /// (benchmarks only). A receiver that checks CRCs rejects such packets.
    pub const NO_CRC: u16 = 1 << 2;
    /// Every flag this version defines; any other bit is an error.
    pub const KNOWN: u16 = ACK_REQUESTED | RETRANSMISSION | NO_CRC;
}

/// Limits the receiver applies while parsing: lengths a peer may not exceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseLimits {
    /// Largest payload this side accepts in one packet (its MTU less the header).
    pub max_payload_len: u32,
    /// Largest message this side accepts.
    pub max_message_len: u64,
    /// Whether the CRC is checked (always, except in benchmarks that measure
    /// what the CRC costs).
    pub verify_crc: bool,
}

/// Why a packet was rejected. Each malformed case is its own variant, and
/// each message says what it means and what to check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than a header.
    Truncated { len: usize },
    /// The first four bytes are not `BLNK`: not a barlink packet, or a slot
    /// that was never written.
    BadMagic { found: u32 },
    /// A peer speaking another protocol version.
    UnsupportedVersion { found: u8 },
    /// A packet kind this version does not define.
    UnknownKind { found: u8 },
    /// Flag bits this version does not define.
    UnknownFlags { found: u16 },
    /// The payload length reaches past the bytes that arrived (past the slot).
    PayloadBeyondBuffer { payload_len: u32, available: usize },
    /// The payload length exceeds this side's configured maximum.
    PayloadTooLong { payload_len: u32, max: u32 },
    /// The message length exceeds this side's configured maximum.
    MessageTooLong { msg_len: u64, max: u64 },
    /// Fragment fields that contradict one another.
    FragmentMismatch { detail: FragmentMismatch },
    /// A control packet that carries payload or message fields.
    ControlPacketWithData { kind: PacketKind },
    /// Epoch zero is reserved for "not known yet" and never names a side.
    ZeroEpoch,
    /// The CRC does not match: the packet was corrupted on the way.
    BadCrc { carried: u32, computed: u32 },
    /// The packet says it carries no CRC but this side checks CRCs.
    CrcRequired,
}

/// The ways fragment fields can contradict one another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragmentMismatch {
    /// `frag_count` is zero.
    ZeroCount,
    /// `frag_index` is not below `frag_count`.
    IndexBeyondCount { index: u32, count: u32 },
    /// The payload is longer than the whole message.
    PayloadBeyondMessage { payload_len: u32, msg_len: u64 },
    /// `frag_count` fragments of this payload size cannot make `msg_len`.
    CountDisagreesWithLength {
        count: u32,
        payload_len: u32,
        msg_len: u64,
    },
    /// A non-final fragment with no payload.
    EmptyInnerFragment,
}

impl fmt::Display for FragmentMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FragmentMismatch::ZeroCount => write!(f, "fragment count is zero"),
            FragmentMismatch::IndexBeyondCount { index, count } => {
                write!(
                    f,
                    "fragment index {index} is not below fragment count {count}"
                )
            }
            FragmentMismatch::PayloadBeyondMessage {
                payload_len,
                msg_len,
            } => write!(
                f,
                "payload of {payload_len} bytes is longer than its {msg_len}-byte message"
            ),
            FragmentMismatch::CountDisagreesWithLength {
                count,
                payload_len,
                msg_len,
            } => write!(
                f,
                "{count} fragments of {payload_len} bytes cannot make a {msg_len}-byte message"
            ),
            FragmentMismatch::EmptyInnerFragment => {
                write!(f, "a fragment other than the last carries no payload")
            }
        }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated { len } => write!(
                f,
                "packet of {len} bytes is shorter than the {HEADER_LEN}-byte header"
            ),
            WireError::BadMagic { found } => write!(
                f,
                "bad magic {found:#010x} (expected {MAGIC:#010x}, \"BLNK\"): not a barlink packet, or a slot that was never written"
            ),
            WireError::UnsupportedVersion { found } => write!(
                f,
                "peer speaks protocol version {found}, this build speaks {VERSION}: run the same barlink version on both sides"
            ),
            WireError::UnknownKind { found } => write!(f, "unknown packet kind {found}"),
            WireError::UnknownFlags { found } => write!(
                f,
                "unknown flag bits {:#06x} (this version knows {:#06x})",
                found & !flags::KNOWN,
                flags::KNOWN
            ),
            WireError::PayloadBeyondBuffer {
                payload_len,
                available,
            } => write!(
                f,
                "payload length {payload_len} reaches past the packet: only {available} bytes follow the header"
            ),
            WireError::PayloadTooLong { payload_len, max } => write!(
                f,
                "payload length {payload_len} exceeds the configured maximum {max}: check that both sides use the same MTU"
            ),
            WireError::MessageTooLong { msg_len, max } => write!(
                f,
                "message length {msg_len} exceeds the configured maximum {max}: raise max_message_len on the receiver"
            ),
            WireError::FragmentMismatch { detail } => {
                write!(f, "fragment fields disagree: {detail}")
            }
            WireError::ControlPacketWithData { kind } => {
                write!(f, "{kind} packet carries payload or message fields")
            }
            WireError::ZeroEpoch => write!(f, "epoch 0 is reserved and names no side"),
            WireError::BadCrc { carried, computed } => write!(
                f,
                "CRC mismatch (carried {carried:#010x}, computed {computed:#010x}): the packet was corrupted in transit"
            ),
            WireError::CrcRequired => write!(
                f,
                "packet carries no CRC but this side requires one: configure both sides alike"
            ),
        }
    }
}

impl std::error::Error for WireError {}

impl WireError {
    /// Whether this is a checksum failure (a bad or missing CRC) rather than
    /// a structural fault; statistics count the two apart.
    pub fn is_corruption(&self) -> bool {
        matches!(self, WireError::BadCrc { .. } | WireError::CrcRequired)
    }
}

/// A read/write view of a packet in a byte buffer.
///
/// Accessors read the header fields as they are; nothing is validated until
/// [`Repr::parse`]. [`Packet::new_checked`] only guarantees that the header
/// and the claimed payload lie within the buffer, so that the accessors and
/// [`Packet::payload`] cannot go out of bounds.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

macro_rules! le_getter {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $field:expr) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(&self) -> $ty {
            let bytes = &self.buffer.as_ref()[$field];
            <$ty>::from_le_bytes(bytes.try_into().expect("field width matches its type"))
        }
    };
}

macro_rules! le_setter {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $field:expr) => {
        $(#[$doc])*
        #[inline]
        pub fn $name(&mut self, value: $ty) {
            self.buffer.as_mut()[$field].copy_from_slice(&value.to_le_bytes());
        }
    };
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking its length; accessors panic if it is
    /// shorter than a header. Use [`Packet::new_checked`] for received bytes.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after checking that the header and the payload length
    /// it claims fit inside it.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the header and the claimed payload fit in the buffer.
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated { len });
        }
        let payload_len = self.payload_len();
        let available = len - HEADER_LEN;
        if payload_len as usize > available {
            return Err(WireError::PayloadBeyondBuffer {
                payload_len,
                available,
            });
        }
        Ok(())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    le_getter!(
        /// The magic number (should be [`MAGIC`]).
        magic, u32, field::MAGIC);
    le_getter!(
        /// Protocol flag bits (see [`flags`]).
        flags, u16, field::FLAGS);
    le_getter!(
        /// The sender's epoch.
        epoch, u32, field::EPOCH);
    le_getter!(
        /// The receiver's epoch as the sender knows it (0: not known yet).
        peer_epoch, u32, field::PEER_EPOCH);
    le_getter!(
        /// Data: this fragment's sequence number. Nak: the transmission
        /// serial of the packet that arrived corrupt.
        seq, u64, field::SEQ);
    le_getter!(
        /// Cumulative acknowledgement: every sequence number below it arrived.
        ack, u64, field::ACK);
    le_getter!(
        /// Selective acknowledgement: bit i set means `ack + 1 + i` arrived.
        sack, u64, field::SACK);
    le_getter!(
        /// Data: the message this fragment belongs to.
        msg_id, u64, field::MSG_ID);
    le_getter!(
        /// Data: the whole message's length in bytes.
        msg_len, u64, field::MSG_LEN);
    le_getter!(
        /// Data: this fragment's position in its message.
        frag_index, u32, field::FRAG_INDEX);
    le_getter!(
        /// Data: how many fragments the message has.
        frag_count, u32, field::FRAG_COUNT);
    le_getter!(
        /// The sender's transmission serial (one per packet sent, wrapping).
        xmit, u32, field::XMIT);
    le_getter!(
        /// Packets beyond `ack` the sender of this packet will accept.
        credit, u32, field::CREDIT);
    le_getter!(
        /// Payload bytes following the header.
        payload_len, u32, field::PAYLOAD_LEN);
    le_getter!(
        /// The CRC-32C over the header's first 76 bytes and the payload.
        crc, u32, field::CRC);

    /// The protocol version byte.
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The raw packet kind byte.
    #[inline]
    pub fn kind_byte(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }

    /// The payload, as long as the header claims. Panics if the claim
    /// exceeds the buffer; [`Packet::new_checked`] rules that out.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let len = self.payload_len() as usize;
        &self.buffer.as_ref()[field::PAYLOAD_START..field::PAYLOAD_START + len]
    }

    /// The CRC-32C of this packet as it is (header bytes 0..76, then the payload).
    pub fn compute_crc(&self) -> u32 {
        let bytes = self.buffer.as_ref();
        let mut crc = Crc32c::new();
        crc.update(&bytes[..CRC_COVERED_HEADER_LEN]);
        crc.update(self.payload());
        crc.finish()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    le_setter!(
        /// Sets the magic number.
        set_magic, u32, field::MAGIC);
    le_setter!(
        /// Sets the flag bits.
        set_flags, u16, field::FLAGS);
    le_setter!(
        /// Sets the sender's epoch.
        set_epoch, u32, field::EPOCH);
    le_setter!(
        /// Sets the receiver's epoch as known to the sender.
        set_peer_epoch, u32, field::PEER_EPOCH);
    le_setter!(
        /// Sets the sequence number.
        set_seq, u64, field::SEQ);
    le_setter!(
        /// Sets the cumulative acknowledgement.
        set_ack, u64, field::ACK);
    le_setter!(
        /// Sets the selective acknowledgement bitmap.
        set_sack, u64, field::SACK);
    le_setter!(
        /// Sets the message id.
        set_msg_id, u64, field::MSG_ID);
    le_setter!(
        /// Sets the message length.
        set_msg_len, u64, field::MSG_LEN);
    le_setter!(
        /// Sets the fragment index.
        set_frag_index, u32, field::FRAG_INDEX);
    le_setter!(
        /// Sets the fragment count.
        set_frag_count, u32, field::FRAG_COUNT);
    le_setter!(
        /// Sets the transmission serial.
        set_xmit, u32, field::XMIT);
    le_setter!(
        /// Sets the credit.
        set_credit, u32, field::CREDIT);
    le_setter!(
        /// Sets the payload length.
        set_payload_len, u32, field::PAYLOAD_LEN);
    le_setter!(
        /// Sets the CRC field.
        set_crc, u32, field::CRC);

    /// Sets the protocol version byte.
    #[inline]
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    /// Sets the raw packet kind byte.
    #[inline]
    pub fn set_kind_byte(&mut self, value: u8) {
        self.buffer.as_mut()[field::KIND] = value;
    }

    /// The payload, writable, as long as the header claims.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = self.payload_len() as usize;
        &mut self.buffer.as_mut()[field::PAYLOAD_START..field::PAYLOAD_START + len]
    }

    /// Computes the CRC over the packet as it now is and stores it.
    pub fn fill_crc(&mut self) {
        let crc = self.compute_crc();
        self.set_crc(crc);
    }
}

/// The fragment fields of a data packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fragment {
    /// The message's id (consecutive within a session).
    pub msg_id: u64,
    /// The whole message's length in bytes.
    pub msg_len: u64,
    /// This fragment's position, `0..count`.
    pub index: u32,
    /// How many fragments the message has (at least 1).
    pub count: u32,
}

impl Fragment {
    /// Whether this is the message's last fragment.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }
}

/// A validated header: what the engine reads from and writes to the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// What the packet is for.
    pub kind: PacketKind,
    /// Flag bits (see [`flags`]); only known bits.
    pub flags: u16,
    /// The sender's epoch (never 0).
    pub epoch: u32,
    /// The receiver's epoch as the sender knows it; 0 before it knows.
    pub peer_epoch: u32,
    /// Data: the fragment's sequence number. Nak: the transmission serial of
    /// the packet that arrived corrupt (as the NAK's sender infers it).
    pub seq: u64,
    /// Cumulative acknowledgement.
    pub ack: u64,
    /// Selective acknowledgement bitmap above `ack`.
    pub sack: u64,
    /// Packets beyond `ack` the sender of this packet accepts.
    pub credit: u32,
    /// Transmission serial.
    pub xmit: u32,
    /// Data packets only.
    pub fragment: Option<Fragment>,
    /// Payload bytes that follow the header.
    pub payload_len: u32,
}

impl Repr {
    /// Parses and validates a packet: magic, version, kind, flags, lengths
    /// against the buffer and `limits`, fragment consistency, and the CRC.
    ///
    /// The CRC is checked last so that a corrupt packet still reports the
    /// first structural problem a reader would want to see first; either
    /// way a packet that fails here is dropped whole.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &Packet<T>,
        limits: &ParseLimits,
    ) -> Result<Repr, WireError> {
        packet.check_len()?;
        let repr = Repr::check_fields(packet, limits)?;
        if repr.crc_to_verify(limits) {
            let computed = packet.compute_crc();
            if computed != packet.crc() {
                return Err(WireError::BadCrc {
                    carried: packet.crc(),
                    computed,
                });
            }
        }
        Ok(repr)
    }

    /// Validates a header whose payload has not been read yet: everything
    /// [`Repr::parse`] checks except the CRC, which covers the payload. `room`
    /// is how many payload bytes could follow the header (a ring slot's
    /// size less the packet's lead and header): a claimed payload beyond it is
    /// [`WireError::PayloadBeyondBuffer`].
    ///
    /// This is how a receiver copies a payload exactly once — out of the
    /// medium straight into its destination, taking the CRC as it goes —
    /// and checks [`Repr::crc_to_verify`] before trusting any of it.
    #[inline]
    pub fn parse_header(
        header: &[u8],
        room: usize,
        limits: &ParseLimits,
    ) -> Result<Repr, WireError> {
        if header.len() < HEADER_LEN {
            return Err(WireError::Truncated { len: header.len() });
        }
        let packet = Packet::new_unchecked(&header[..HEADER_LEN]);
        let payload_len = packet.payload_len();
        if payload_len as usize > room {
            return Err(WireError::PayloadBeyondBuffer {
                payload_len,
                available: room,
            });
        }
        Repr::check_fields(&packet, limits)
    }

    /// Whether a packet with this header must have its CRC checked under
    /// `limits` (it carries one and the receiver verifies).
    pub fn crc_to_verify(&self, limits: &ParseLimits) -> bool {
        limits.verify_crc && self.flags & flags::NO_CRC == 0
    }

    /// Every check but the buffer length and the CRC itself, in the order
    /// [`Repr::parse`] reports them.
    fn check_fields<T: AsRef<[u8]>>(
        packet: &Packet<T>,
        limits: &ParseLimits,
    ) -> Result<Repr, WireError> {
        if packet.magic() != MAGIC {
            return Err(WireError::BadMagic {
                found: packet.magic(),
            });
        }
        if packet.version() != VERSION {
            return Err(WireError::UnsupportedVersion {
                found: packet.version(),
            });
        }
        let kind = PacketKind::from_u8(packet.kind_byte()).ok_or(WireError::UnknownKind {
            found: packet.kind_byte(),
        })?;
        let packet_flags = packet.flags();
        if packet_flags & !flags::KNOWN != 0 {
            return Err(WireError::UnknownFlags {
                found: packet_flags,
            });
        }
        let payload_len = packet.payload_len();
        if payload_len > limits.max_payload_len {
            return Err(WireError::PayloadTooLong {
                payload_len,
                max: limits.max_payload_len,
            });
        }
        if packet.epoch() == 0 {
            return Err(WireError::ZeroEpoch);
        }
        let fragment = if kind == PacketKind::Data {
            let fragment = Fragment {
                msg_id: packet.msg_id(),
                msg_len: packet.msg_len(),
                index: packet.frag_index(),
                count: packet.frag_count(),
            };
            if fragment.msg_len > limits.max_message_len {
                return Err(WireError::MessageTooLong {
                    msg_len: fragment.msg_len,
                    max: limits.max_message_len,
                });
            }
            check_fragment(&fragment, payload_len)
                .map_err(|detail| WireError::FragmentMismatch { detail })?;
            Some(fragment)
        } else {
            if payload_len != 0
                || packet.msg_id() != 0
                || packet.msg_len() != 0
                || packet.frag_index() != 0
                || packet.frag_count() != 0
            {
                return Err(WireError::ControlPacketWithData { kind });
            }
            None
        };
        if packet_flags & flags::NO_CRC != 0 && limits.verify_crc {
            return Err(WireError::CrcRequired);
        }
        Ok(Repr {
            kind,
            flags: packet_flags,
            epoch: packet.epoch(),
            peer_epoch: packet.peer_epoch(),
            seq: packet.seq(),
            ack: packet.ack(),
            sack: packet.sack(),
            credit: packet.credit(),
            xmit: packet.xmit(),
            fragment,
            payload_len,
        })
    }

    /// Bytes this packet occupies on the wire.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize
    }

    /// Writes every header field except the CRC, which stays zero: the CRC
    /// covers the payload too, and links compute it while they copy the
    /// payload (see [`crc_of_parts`]).
    #[inline]
    pub fn emit_header(&self, header: &mut [u8; HEADER_LEN]) {
        let mut packet = Packet::new_unchecked(&mut header[..]);
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_kind_byte(self.kind as u8);
        packet.set_flags(self.flags);
        packet.set_epoch(self.epoch);
        packet.set_peer_epoch(self.peer_epoch);
        packet.set_seq(self.seq);
        packet.set_ack(self.ack);
        packet.set_sack(self.sack);
        let fragment = self.fragment.unwrap_or(Fragment {
            msg_id: 0,
            msg_len: 0,
            index: 0,
            count: 0,
        });
        packet.set_msg_id(fragment.msg_id);
        packet.set_msg_len(fragment.msg_len);
        packet.set_frag_index(fragment.index);
        packet.set_frag_count(fragment.count);
        packet.set_xmit(self.xmit);
        packet.set_credit(self.credit);
        packet.set_payload_len(self.payload_len);
        packet.set_crc(0);
    }

    /// Writes the whole packet — header, `payload`, CRC — into `buffer` and
    /// returns its length. `payload.len()` must equal `payload_len` and the
    /// buffer must hold [`Repr::buffer_len`] bytes; both are programming
    /// errors of the caller and panic.
    pub fn emit(&self, buffer: &mut [u8], payload: &[u8]) -> usize {
        assert_eq!(payload.len(), self.payload_len as usize, "payload length");
        let len = self.buffer_len();
        assert!(buffer.len() >= len, "buffer of {} < {len}", buffer.len());
        let mut header = [0u8; HEADER_LEN];
        self.emit_header(&mut header);
        buffer[..HEADER_LEN].copy_from_slice(&header);
        buffer[HEADER_LEN..len].copy_from_slice(payload);
        let crc = if self.flags & flags::NO_CRC != 0 {
            0
        } else {
            crc_of_parts(&header, &buffer[HEADER_LEN..len])
        };
        buffer[field::CRC].copy_from_slice(&crc.to_le_bytes());
        len
    }
}

/// The packet CRC from its header (CRC field ignored) and its payload.
pub fn crc_of_parts(header: &[u8; HEADER_LEN], payload: &[u8]) -> u32 {
    let mut crc = Crc32c::new();
    crc.update(&header[..CRC_COVERED_HEADER_LEN]);
    crc.update(payload);
    crc.finish()
}

/// Stateless fragment checks: the fields of one packet must be able to
/// describe a real message. Non-final fragments all carry the same payload
/// size `P`, so a message of `count` fragments has `(count-1)*P < len <= count*P`.
fn check_fragment(fragment: &Fragment, payload_len: u32) -> Result<(), FragmentMismatch> {
    let Fragment {
        msg_len,
        index,
        count,
        ..
    } = *fragment;
    if count == 0 {
        return Err(FragmentMismatch::ZeroCount);
    }
    if index >= count {
        return Err(FragmentMismatch::IndexBeyondCount { index, count });
    }
    if u64::from(payload_len) > msg_len {
        return Err(FragmentMismatch::PayloadBeyondMessage {
            payload_len,
            msg_len,
        });
    }
    let disagree = FragmentMismatch::CountDisagreesWithLength {
        count,
        payload_len,
        msg_len,
    };
    if count == 1 {
        // A single fragment carries the whole message.
        if u64::from(payload_len) != msg_len {
            return Err(disagree);
        }
    } else if !fragment.is_last() {
        if payload_len == 0 {
            return Err(FragmentMismatch::EmptyInnerFragment);
        }
        let full = u64::from(count - 1) * u64::from(payload_len);
        let max = u64::from(count) * u64::from(payload_len);
        if !(full < msg_len && msg_len <= max) {
            return Err(disagree);
        }
    } else if payload_len == 0 || u64::from(count) > msg_len {
        // The last of several fragments carries at least one byte, and a
        // message cannot have more fragments than bytes.
        return Err(disagree);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ParseLimits = ParseLimits {
        max_payload_len: 4096,
        max_message_len: 1 << 30,
        verify_crc: true,
    };

    fn data_repr(payload_len: u32) -> Repr {
        Repr {
            kind: PacketKind::Data,
            flags: flags::ACK_REQUESTED,
            epoch: 7,
            peer_epoch: 9,
            seq: 0x0102_0304_0506_0708,
            ack: 0x1112_1314_1516_1718,
            sack: 0x2122_2324_2526_2728,
            credit: 0x3132_3334,
            xmit: 0x4142_4344,
            fragment: Some(Fragment {
                msg_id: 0x5152_5354_5556_5758,
                // Two fragments: this full one and a last one a byte shorter.
                msg_len: (2 * u64::from(payload_len)).saturating_sub(1),
                index: 0,
                count: 2,
            }),
            payload_len,
        }
    }

    fn emit(repr: &Repr, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, payload);
        buf
    }

    fn parse(bytes: &[u8]) -> Result<Repr, WireError> {
        Repr::parse(&Packet::new_unchecked(bytes), &LIMITS)
    }

    /// Rewrites one field and fixes the CRC, so that the field's own check
    /// (not the CRC) is what rejects the packet.
    fn with_field(bytes: &[u8], edit: impl FnOnce(&mut Packet<&mut [u8]>)) -> Vec<u8> {
        let mut copy = bytes.to_vec();
        let mut packet = Packet::new_unchecked(&mut copy[..]);
        edit(&mut packet);
        if packet.check_len().is_ok() {
            packet.fill_crc();
        }
        copy
    }

    #[test]
    fn every_field_lands_at_its_documented_offset() {
        let payload = [0xAB; 200];
        let bytes = emit(&data_repr(200), &payload);
        assert_eq!(&bytes[0..4], b"BLNK");
        assert_eq!(bytes[4], VERSION);
        assert_eq!(bytes[5], PacketKind::Data as u8);
        assert_eq!(&bytes[6..8], &flags::ACK_REQUESTED.to_le_bytes());
        assert_eq!(&bytes[8..12], &7u32.to_le_bytes());
        assert_eq!(&bytes[12..16], &9u32.to_le_bytes());
        assert_eq!(&bytes[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&bytes[24..32], &0x1112_1314_1516_1718u64.to_le_bytes());
        assert_eq!(&bytes[32..40], &0x2122_2324_2526_2728u64.to_le_bytes());
        assert_eq!(&bytes[40..48], &0x5152_5354_5556_5758u64.to_le_bytes());
        assert_eq!(&bytes[48..56], &399u64.to_le_bytes());
        assert_eq!(&bytes[56..60], &0u32.to_le_bytes());
        assert_eq!(&bytes[60..64], &2u32.to_le_bytes());
        assert_eq!(&bytes[64..68], &0x4142_4344u32.to_le_bytes());
        assert_eq!(&bytes[68..72], &0x3132_3334u32.to_le_bytes());
        assert_eq!(&bytes[72..76], &200u32.to_le_bytes());
        let crc = crate::crc::crc32c(
            &[&bytes[..76], &bytes[80..]].concat(), // header less CRC, then payload
        );
        assert_eq!(&bytes[76..80], &crc.to_le_bytes());
        assert_eq!(&bytes[80..], &payload[..]);
    }

    #[test]
    fn parse_inverts_emit_for_every_kind() {
        let data = data_repr(64);
        let bytes = emit(&data, &[1; 64]);
        assert_eq!(parse(&bytes), Ok(data));
        assert_eq!(Packet::new_checked(&bytes[..]).unwrap().payload(), &[1; 64]);
        for kind in [
            PacketKind::Ack,
            PacketKind::Nak,
            PacketKind::Heartbeat,
            PacketKind::Close,
        ] {
            let repr = Repr {
                kind,
                flags: 0,
                fragment: None,
                payload_len: 0,
                ..data
            };
            assert_eq!(parse(&emit(&repr, &[])), Ok(repr), "{kind}");
        }
    }

    #[test]
    fn trailing_bytes_after_the_payload_are_ignored() {
        // A ring slot is larger than most packets; what follows is not ours.
        let mut bytes = emit(&data_repr(10), &[5; 10]);
        bytes.extend_from_slice(&[0xEE; 100]);
        assert_eq!(parse(&bytes).map(|r| r.payload_len), Ok(10));
    }

    #[test]
    fn short_buffer_is_truncated() {
        let bytes = emit(&data_repr(10), &[0; 10]);
        assert_eq!(parse(&bytes[..79]), Err(WireError::Truncated { len: 79 }));
        assert_eq!(parse(&[]), Err(WireError::Truncated { len: 0 }));
    }

    #[test]
    fn payload_past_the_buffer_is_rejected_before_any_read() {
        let bytes = emit(&data_repr(10), &[0; 10]);
        assert_eq!(
            parse(&bytes[..85]),
            Err(WireError::PayloadBeyondBuffer {
                payload_len: 10,
                available: 5
            })
        );
        let huge = with_field(&bytes, |p| p.set_payload_len(u32::MAX));
        assert!(matches!(
            parse(&huge),
            Err(WireError::PayloadBeyondBuffer { .. })
        ));
    }

    #[test]
    fn bad_magic_version_kind_flags() {
        let bytes = emit(&data_repr(10), &[0; 10]);
        assert_eq!(
            parse(&with_field(&bytes, |p| p.set_magic(0xdead_beef))),
            Err(WireError::BadMagic { found: 0xdead_beef })
        );
        assert_eq!(
            parse(&with_field(&bytes, |p| p.set_version(2))),
            Err(WireError::UnsupportedVersion { found: 2 })
        );
        for kind in [0u8, 6, 255] {
            assert_eq!(
                parse(&with_field(&bytes, |p| p.set_kind_byte(kind))),
                Err(WireError::UnknownKind { found: kind })
            );
        }
        assert_eq!(
            parse(&with_field(&bytes, |p| p.set_flags(0x8001))),
            Err(WireError::UnknownFlags { found: 0x8001 })
        );
    }

    #[test]
    fn lengths_beyond_configured_maxima() {
        let payload = vec![0; 5000];
        let mut repr = data_repr(5000);
        repr.fragment = Some(Fragment {
            msg_id: 1,
            msg_len: 5000,
            index: 0,
            count: 1,
        });
        assert_eq!(
            parse(&emit(&repr, &payload)),
            Err(WireError::PayloadTooLong {
                payload_len: 5000,
                max: 4096
            })
        );
        let bytes = emit(&data_repr(10), &[0; 10]);
        assert_eq!(
            parse(&with_field(&bytes, |p| p.set_msg_len((1 << 30) + 1))),
            Err(WireError::MessageTooLong {
                msg_len: (1 << 30) + 1,
                max: 1 << 30
            })
        );
    }

    #[test]
    fn fragment_fields_that_disagree() {
        let bytes = emit(&data_repr(100), &[0; 100]); // msg_len 199, index 0 of 2
        type Edit<'a> = &'a dyn Fn(&mut Packet<&mut [u8]>);
        let cases: [(Edit, FragmentMismatch); 6] = [
            (&|p| p.set_frag_count(0), FragmentMismatch::ZeroCount),
            (
                &|p| p.set_frag_index(2),
                FragmentMismatch::IndexBeyondCount { index: 2, count: 2 },
            ),
            (
                &|p| p.set_msg_len(50),
                FragmentMismatch::PayloadBeyondMessage {
                    payload_len: 100,
                    msg_len: 50,
                },
            ),
            (
                // 2 fragments of 100 cannot make 201 bytes.
                &|p| p.set_msg_len(201),
                FragmentMismatch::CountDisagreesWithLength {
                    count: 2,
                    payload_len: 100,
                    msg_len: 201,
                },
            ),
            (
                // A lone fragment must carry the whole message.
                &|p| p.set_frag_count(1),
                FragmentMismatch::CountDisagreesWithLength {
                    count: 1,
                    payload_len: 100,
                    msg_len: 199,
                },
            ),
            (
                // The last fragment is never empty when there are several.
                &|p| {
                    p.set_frag_index(1);
                    p.set_payload_len(0)
                },
                FragmentMismatch::CountDisagreesWithLength {
                    count: 2,
                    payload_len: 0,
                    msg_len: 199,
                },
            ),
        ];
        for (edit, detail) in cases {
            assert_eq!(
                parse(&with_field(&bytes, edit)),
                Err(WireError::FragmentMismatch { detail })
            );
        }
        let empty_inner = with_field(&bytes, |p| {
            p.set_frag_count(3);
            p.set_payload_len(0)
        });
        assert_eq!(
            parse(&empty_inner),
            Err(WireError::FragmentMismatch {
                detail: FragmentMismatch::EmptyInnerFragment
            })
        );
    }

    #[test]
    fn empty_message_is_one_empty_fragment() {
        let mut repr = data_repr(0);
        repr.fragment = Some(Fragment {
            msg_id: 3,
            msg_len: 0,
            index: 0,
            count: 1,
        });
        assert_eq!(parse(&emit(&repr, &[])), Ok(repr));
    }

    #[test]
    fn control_packets_carry_no_data() {
        let repr = Repr {
            kind: PacketKind::Ack,
            flags: 0,
            fragment: None,
            payload_len: 0,
            ..data_repr(0)
        };
        let bytes = emit(&repr, &[]);
        assert_eq!(
            parse(&with_field(&bytes, |p| p.set_msg_id(1))),
            Err(WireError::ControlPacketWithData {
                kind: PacketKind::Ack
            })
        );
        let mut with_payload = bytes.clone();
        with_payload.extend_from_slice(&[0; 4]);
        let with_payload = with_field(&with_payload, |p| p.set_payload_len(4));
        assert_eq!(
            parse(&with_payload),
            Err(WireError::ControlPacketWithData {
                kind: PacketKind::Ack
            })
        );
    }

    #[test]
    fn zero_epoch_is_rejected() {
        let bytes = emit(&data_repr(10), &[0; 10]);
        assert_eq!(
            parse(&with_field(&bytes, |p| p.set_epoch(0))),
            Err(WireError::ZeroEpoch)
        );
    }

    #[test]
    fn any_single_bit_flip_is_caught() {
        let payload: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut repr = data_repr(300);
        repr.fragment = Some(Fragment {
            msg_id: 1,
            msg_len: 300,
            index: 0,
            count: 1,
        });
        let bytes = emit(&repr, &payload);
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(parse(&flipped).is_err(), "flip of bit {bit} went unnoticed");
        }
        // A flip of a payload or CRC bit is, specifically, a CRC failure.
        let mut flipped = bytes.clone();
        flipped[HEADER_LEN + 17] ^= 0x10;
        assert!(matches!(parse(&flipped), Err(WireError::BadCrc { .. })));
    }

    #[test]
    fn no_crc_packets_need_both_sides_configured_so() {
        let mut repr = data_repr(10);
        repr.flags |= flags::NO_CRC;
        let bytes = emit(&repr, &[0; 10]);
        assert_eq!(parse(&bytes), Err(WireError::CrcRequired));
        let lax = ParseLimits {
            verify_crc: false,
            ..LIMITS
        };
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&bytes[..]), &lax),
            Ok(repr)
        );
    }

    #[test]
    fn every_error_explains_itself() {
        let errors = [
            WireError::Truncated { len: 3 },
            WireError::BadMagic { found: 0 },
            WireError::UnsupportedVersion { found: 9 },
            WireError::UnknownKind { found: 0 },
            WireError::UnknownFlags { found: 0x100 },
            WireError::PayloadBeyondBuffer {
                payload_len: 9,
                available: 1,
            },
            WireError::PayloadTooLong {
                payload_len: 9,
                max: 1,
            },
            WireError::MessageTooLong { msg_len: 9, max: 1 },
            WireError::FragmentMismatch {
                detail: FragmentMismatch::ZeroCount,
            },
            WireError::ControlPacketWithData {
                kind: PacketKind::Close,
            },
            WireError::ZeroEpoch,
            WireError::BadCrc {
                carried: 1,
                computed: 2,
            },
            WireError::CrcRequired,
        ];
        for error in errors {
            let text = error.to_string();
            assert!(text.len() > 20, "{error:?} says too little: {text}");
        }
    }
}
