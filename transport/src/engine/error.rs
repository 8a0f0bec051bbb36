//! What can go wrong: why a link ended ([`LinkError`]), why a packet was
//! dropped ([`PacketError`], [`Violation`]) and why a message was refused
//! ([`SendError`]).

use std::fmt;
use std::time::Duration;

use crate::wire::WireError;

/// Why a link ended or a message could not be delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkError {
    /// This side closed the link.
    LocalClose,
    /// The peer closed the link.
    PeerClosed,
    /// For `silent_for`, no intact packet came from the peer addressed to
    /// this side's epoch: the peer is dead, or the path fails one way.
    PeerLost { silent_for: Duration },
    /// The peer came back with a new epoch; the old session is gone.
    PeerRestarted { old_epoch: u32, new_epoch: u32 },
    /// One packet was sent `transmissions` times and never acknowledged
    /// while the peer stayed alive: the path loses or corrupts it every time.
    RetransmitLimit {
        msg_id: u64,
        seq: u64,
        transmissions: u32,
    },
    /// The peer sent fragments, with valid CRCs, that contradict each other.
    ProtocolViolation { seq: u64, detail: Violation },
    /// A message could not be given memory to be assembled in.
    OutOfMemory { msg_id: u64, bytes: usize },
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::LocalClose => write!(f, "the link was closed by this side"),
            LinkError::PeerClosed => write!(f, "the peer closed the link"),
            LinkError::PeerLost { silent_for } => write!(
                f,
                "peer lost: for {silent_for:?} no intact packet showed that the peer hears this side (is the peer process alive? does the path deliver both ways? try `barlink doctor`)"
            ),
            LinkError::PeerRestarted {
                old_epoch,
                new_epoch,
            } => write!(
                f,
                "the peer restarted (epoch {old_epoch} -> {new_epoch}); messages of the old session were not confirmed"
            ),
            LinkError::RetransmitLimit {
                msg_id,
                seq,
                transmissions,
            } => write!(
                f,
                "message {msg_id}: packet {seq} was sent {transmissions} times and never got through intact; the path corrupts or drops it every time (run `barlink validate` on it)"
            ),
            LinkError::ProtocolViolation { seq, detail } => {
                write!(
                    f,
                    "protocol violation by the peer at packet {seq}: {detail}"
                )
            }
            LinkError::OutOfMemory { msg_id, bytes } => write!(
                f,
                "out of memory assembling message {msg_id} ({bytes} bytes): lower max_message_len or free memory"
            ),
        }
    }
}

impl std::error::Error for LinkError {}

/// Ways a peer's fragments, each valid alone, contradict the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A message's first in-order fragment is not fragment 0.
    MessageStartsMidway { msg_id: u64, index: u32 },
    /// A message id out of sequence.
    UnexpectedMessageId { expected: u64, found: u64 },
    /// A fragment's message fields differ from the message being assembled.
    FragmentOfAnotherMessage {
        expected_msg_id: u64,
        found_msg_id: u64,
    },
    /// A fragment index out of sequence.
    FragmentOutOfPlace {
        msg_id: u64,
        expected: u32,
        found: u32,
    },
    /// A fragment whose size does not fit its message.
    FragmentLengthWrong {
        msg_id: u64,
        index: u32,
        payload_len: usize,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Violation::MessageStartsMidway { msg_id, index } => {
                write!(f, "message {msg_id} starts at fragment {index}, not 0")
            }
            Violation::UnexpectedMessageId { expected, found } => {
                write!(f, "expected message {expected}, got message {found}")
            }
            Violation::FragmentOfAnotherMessage {
                expected_msg_id,
                found_msg_id,
            } => write!(
                f,
                "fragment of message {found_msg_id} (or with different length or count) inside message {expected_msg_id}"
            ),
            Violation::FragmentOutOfPlace {
                msg_id,
                expected,
                found,
            } => write!(
                f,
                "message {msg_id}: expected fragment {expected}, got fragment {found}"
            ),
            Violation::FragmentLengthWrong {
                msg_id,
                index,
                payload_len,
            } => write!(
                f,
                "message {msg_id}: fragment {index} of {payload_len} bytes does not fit the message"
            ),
        }
    }
}

/// Why [`Engine::handle_packet`] dropped a packet. None of these ends the
/// link by itself except [`PacketError::Violation`] and
/// [`PacketError::OutOfMemory`] (reported as [`Event::Closed`] too); the
/// rest are for logs and statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PacketError {
    /// Malformed or corrupt on the wire (a NAK goes back).
    Wire(WireError),
    /// From an earlier epoch of the peer: left over from before it restarted.
    StaleEpoch { epoch: u32, current: u32 },
    /// Addressed to another epoch of this side (0: the peer does not know
    /// us yet); data in it is not ours to deliver.
    Misaddressed { addressed_to: u32, mine: u32 },
    /// Acknowledges a packet never sent.
    AckBeyondSent { ack: u64, next_seq: u64 },
    /// Beyond the credit this side granted.
    OutsideWindow {
        seq: u64,
        window_start: u64,
        window_end: u64,
    },
    /// Contradicts the stream; the link is closed.
    Violation { seq: u64, detail: Violation },
    /// Memory for the message being assembled could not be had; the link
    /// is closed.
    OutOfMemory { seq: u64, msg_id: u64, bytes: usize },
    /// The engine is closed and takes no more packets.
    EngineClosed,
}

impl From<WireError> for PacketError {
    fn from(error: WireError) -> Self {
        PacketError::Wire(error)
    }
}

impl fmt::Display for PacketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PacketError::Wire(error) => error.fmt(f),
            PacketError::StaleEpoch { epoch, current } => write!(
                f,
                "stale epoch {epoch}: the peer is now at epoch {current}; this packet predates its restart"
            ),
            PacketError::Misaddressed { addressed_to, mine } => write!(
                f,
                "packet addressed to epoch {addressed_to} of this side, which is at epoch {mine}"
            ),
            PacketError::AckBeyondSent { ack, next_seq } => write!(
                f,
                "acknowledgement {ack} covers packets never sent (next is {next_seq})"
            ),
            PacketError::OutsideWindow {
                seq,
                window_start,
                window_end,
            } => write!(
                f,
                "packet {seq} outside the granted window {window_start}..{window_end}: the peer ignores flow control"
            ),
            PacketError::Violation { seq, detail } => {
                write!(f, "protocol violation at packet {seq}: {detail}")
            }
            PacketError::OutOfMemory { seq, msg_id, bytes } => write!(
                f,
                "packet {seq}: no memory for {bytes} bytes of message {msg_id}; lower max_message_len or free memory"
            ),
            PacketError::EngineClosed => write!(f, "the engine is closed"),
        }
    }
}

impl std::error::Error for PacketError {}

/// Why [`Engine::send`] refused a message; the buffer comes back.
#[derive(Debug)]
#[non_exhaustive]
pub enum SendError<B> {
    /// `send_queue_limit` messages are already queued: poll, then retry.
    QueueFull(B),
    /// Longer than `max_message_len`.
    TooLong { buf: B, len: u64, max: u64 },
    /// The link is closing or closed.
    Closed(B),
}

impl<B> SendError<B> {
    /// The buffer that was not sent.
    pub fn into_buf(self) -> B {
        match self {
            SendError::QueueFull(buf) | SendError::TooLong { buf, .. } | SendError::Closed(buf) => {
                buf
            }
        }
    }
}

impl<B> fmt::Display for SendError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::QueueFull(_) => write!(
                f,
                "send queue full: wait for completions (poll events) before sending more"
            ),
            SendError::TooLong { len, max, .. } => {
                write!(f, "message of {len} bytes exceeds max_message_len {max}")
            }
            SendError::Closed(_) => write!(f, "the link is closed"),
        }
    }
}

impl<B: fmt::Debug> std::error::Error for SendError<B> {}
