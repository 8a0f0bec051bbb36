//! What the engine tells its owner: [`Event`]s, and the queue that keeps
//! delivered messages apart from other events while preserving their order.

use std::collections::VecDeque;
use std::fmt;

use super::error::LinkError;
use super::posted::{PostedRecv, Room};
use super::recv::Completed;

/// Identifies a message within one engine's sending side; the receiving
/// side sees the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId(pub u64);

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "message {}", self.0)
    }
}

/// Something the owner of an engine should know about.
#[derive(Debug)]
pub enum Event<B> {
    /// The first intact packet from the peer arrived (a hello, typically):
    /// its epoch is now known. Data flows once the peer has heard this side
    /// too.
    Connected { peer_epoch: u32 },
    /// A message arrived whole and intact, in order, exactly once.
    Message { id: MessageId, data: Vec<u8> },
    /// A message arrived whole and intact, in order, exactly once, in the
    /// first `len` bytes of a target the caller posted.
    Landed {
        id: MessageId,
        recv: PostedRecv,
        len: usize,
    },
    /// The peer acknowledged every fragment; the buffer is yours again.
    SendComplete { id: MessageId, buf: B },
    /// The message will not be delivered by this session; the buffer is
    /// yours again. The peer may have received some or all of it.
    SendFailed {
        id: MessageId,
        buf: B,
        error: LinkError,
    },
    /// The peer restarted: every message of the old session not yet
    /// acknowledged failed with [`LinkError::PeerRestarted`], a partly
    /// received message was dropped, and a new session began.
    PeerRestarted { old_epoch: u32, new_epoch: u32 },
    /// The link ended; nothing more will be sent or delivered.
    Closed { reason: LinkError },
}

/// A delivered event and, for messages, what taking it frees.
#[derive(Debug)]
pub(super) struct Queued<B> {
    pub(super) event: Event<B>,
    pub(super) packets: u32,
    pub(super) bytes: usize,
}

/// Events for the caller: delivered messages in one queue, everything else
/// in another, each entry numbered so that [`Engine::poll_event`] still
/// returns them in the order they happened. Two queues let a link take
/// completions and state changes at once while messages wait, still
/// holding the credit, until its caller receives them.
#[derive(Debug)]
pub(super) struct EventQueue<B> {
    pub(super) messages: VecDeque<(u64, Queued<B>)>,
    pub(super) others: VecDeque<(u64, Queued<B>)>,
    next: u64,
}

impl<B> EventQueue<B> {
    pub(super) fn new() -> Self {
        EventQueue {
            messages: VecDeque::new(),
            others: VecDeque::new(),
            next: 0,
        }
    }

    #[inline]
    pub(super) fn push_back(&mut self, queued: Queued<B>) {
        let entry = (self.next, queued);
        self.next += 1;
        if matches!(entry.1.event, Event::Message { .. } | Event::Landed { .. }) {
            self.messages.push_back(entry);
        } else {
            self.others.push_back(entry);
        }
    }

    /// The oldest event of either kind.
    pub(super) fn pop_front(&mut self) -> Option<Queued<B>> {
        let messages_first = match (self.messages.front(), self.others.front()) {
            (Some((m, _)), Some((o, _))) => m < o,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let queue = if messages_first {
            &mut self.messages
        } else {
            &mut self.others
        };
        queue.pop_front().map(|(_, queued)| queued)
    }
}

/// Queues a completed message for the caller (a free function so that the
/// receiver can call it while the engine's other fields are borrowed).
pub(super) fn queue_delivered<B>(events: &mut EventQueue<B>, completed: Completed) {
    let id = MessageId(completed.msg_id);
    let event = match completed.data {
        Room::Owned(data) => Event::Message { id, data },
        Room::Lent(recv) => Event::Landed {
            id,
            recv,
            len: completed.len,
        },
    };
    events.push_back(Queued {
        event,
        packets: completed.packets,
        bytes: completed.len,
    });
}
