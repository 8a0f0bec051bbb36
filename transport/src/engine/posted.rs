//! Memory the caller lends the engine to receive into: a posted receive.
//!
//! A message that starts in order while a posted target is waiting, and
//! fits it, is assembled straight in the caller's memory; the link's
//! checked copy out of the medium is then the only copy the message takes
//! on its way in. Targets are taken in the order they were posted, one per
//! message. A message that does not fit the first target, or that began
//! before it was posted (or ahead of a gap, after a loss), is assembled in
//! a buffer of the engine's as before and the target stays posted; the
//! caller sees which by what it is handed ([`Delivery`]).
//!
//! A combining target (an all-reduce's partial sums) takes only the one
//! message it names, and folds that message's bytes into what it holds
//! ([`RecvTarget::combine`]) rather than taking them. Folding cannot be
//! undone, so nothing is folded before its CRC passed: the engine never
//! lets the medium copy into a combining target, it copies each packet
//! into its own packet-sized buffer and folds it from there once the
//! packet is accepted, in order, each byte once.

use std::collections::VecDeque;
use std::fmt;

use super::event::MessageId;

/// Memory a message may land in: its whole length is the room, a message
/// lands at its start. Implemented for `Vec<u8>` (its current length, not
/// its capacity) and `Box<[u8]>`; a face over foreign memory (C, Python)
/// implements it over the caller's range.
pub trait RecvTarget: Send {
    /// The memory. Must return the same range, of the same length, every
    /// time it is called.
    fn bytes_mut(&mut self) -> &mut [u8];

    /// The length of the whole buffer this target is one range of, when
    /// the caller lends a large buffer range by range (0: the target
    /// stands alone). Only a hint for how to write: a medium writes a
    /// range of a buffer this long as it writes a message this long (the
    /// ring link, around the cache past a few MiB).
    fn buffer_len(&self) -> u64 {
        0
    }

    /// For a combining target: the one message it takes (the id the
    /// engine will deliver it under), which must be as long as the target.
    /// Other messages pass it by, and it stays posted. `None` (the
    /// default): the target takes bytes.
    fn combines(&self) -> Option<MessageId> {
        None
    }

    /// Folds `bytes`, the message's bytes from offset `at`, into the
    /// target. Called only on a target whose [`RecvTarget::combines`] is
    /// `Some`, in order from offset 0, each byte once, with bytes whose
    /// CRC passed; a piece may end inside an element. The target's
    /// `bytes_mut` is never written.
    fn combine(&mut self, at: usize, bytes: &[u8]) {
        let _ = (at, bytes);
    }
}

impl RecvTarget for Vec<u8> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl RecvTarget for Box<[u8]> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// Names one posted receive, from [`Engine::post_recv`](super::Engine::post_recv).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PostId(pub u64);

/// A posted target and its name, as the engine holds it and hands it back.
pub struct PostedRecv {
    id: PostId,
    len: usize,
    buffer_len: u64,
    /// [`RecvTarget::combines`], as it was when posted.
    combines: Option<MessageId>,
    /// A combining target a session reset passed over: it may hold part of
    /// a message the new session will never finish, so it takes none.
    spoiled: bool,
    target: Box<dyn RecvTarget>,
}

impl fmt::Debug for PostedRecv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostedRecv")
            .field("id", &self.id)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl PostedRecv {
    pub(super) fn new(id: PostId, mut target: Box<dyn RecvTarget>) -> PostedRecv {
        let len = target.bytes_mut().len();
        let buffer_len = target.buffer_len();
        let combines = target.combines();
        PostedRecv {
            id,
            len,
            buffer_len,
            combines,
            spoiled: false,
            target,
        }
    }

    /// Whether this target folds its message in (see
    /// [`RecvTarget::combines`]).
    pub fn is_combining(&self) -> bool {
        self.combines.is_some()
    }

    /// Whether the message `msg_id`, `len` bytes, may be assembled here: a
    /// combining target takes only the message it names, and only of its
    /// own length (one of another is left to the caller to refuse before
    /// anything of it is folded in).
    fn takes(&self, msg_id: u64, len: usize) -> bool {
        match self.combines {
            None => self.len >= len,
            Some(id) => id.0 == msg_id && self.len == len && !self.spoiled,
        }
    }

    /// Folds a packet's checked bytes, `at` the message's offset.
    pub(super) fn combine(&mut self, at: usize, bytes: &[u8]) {
        self.target.combine(at, bytes);
    }

    /// Which post this is.
    pub fn id(&self) -> PostId {
        self.id
    }

    /// The target's length: the largest message it takes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the target has no room at all (only empty messages fit).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The caller's target back.
    pub fn into_target(self) -> Box<dyn RecvTarget> {
        self.target
    }

    /// The target's memory, exactly `len` bytes (a target whose length
    /// changed after posting is held to the length it had).
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        let bytes = self.target.bytes_mut();
        let len = self.len.min(bytes.len());
        &mut bytes[..len]
    }
}

/// A delivered message: in a buffer of the engine's, or landed in a target
/// the caller posted.
#[derive(Debug)]
pub enum Delivery {
    /// In a buffer that is the caller's now (give it back with
    /// `recycle_buffer` to spare an allocation).
    Message { id: MessageId, data: Vec<u8> },
    /// In the posted target's first `len` bytes.
    Landed {
        id: MessageId,
        recv: PostedRecv,
        len: usize,
    },
}

impl Delivery {
    /// The message's id.
    pub fn id(&self) -> MessageId {
        match self {
            Delivery::Message { id, .. } | Delivery::Landed { id, .. } => *id,
        }
    }

    /// The message's length.
    pub fn len(&self) -> usize {
        match self {
            Delivery::Message { data, .. } => data.len(),
            Delivery::Landed { len, .. } => *len,
        }
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a message is assembled: a buffer of the engine's, or a posted
/// target.
#[derive(Debug)]
pub(super) enum Room {
    Owned(Vec<u8>),
    Lent(PostedRecv),
}

impl Room {
    /// Makes `[..need]` usable room. An owned buffer grows (see
    /// `recv::make_room`); a lent one has what it has.
    pub(super) fn make_room(
        &mut self,
        need: usize,
        want: usize,
        limit: usize,
    ) -> Result<(), usize> {
        match self {
            Room::Owned(data) => super::recv::make_room(data, need, want, limit),
            Room::Lent(posted) if need <= posted.len => Ok(()),
            Room::Lent(_) => Err(need),
        }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Room::Owned(data) => data,
            Room::Lent(posted) => posted.bytes_mut(),
        }
    }

    /// Whether the medium may copy a packet here before its CRC is
    /// checked: not into a combining target, which folds bytes in for good.
    pub(super) fn takes_placement(&self) -> bool {
        !matches!(self, Room::Lent(posted) if posted.is_combining())
    }

    /// Usable bytes now.
    pub(super) fn len(&self) -> usize {
        match self {
            Room::Owned(data) => data.len(),
            Room::Lent(posted) => posted.len,
        }
    }

    /// Memory of the engine's it holds (a lent target is the caller's).
    pub(super) fn capacity(&self) -> usize {
        match self {
            Room::Owned(data) => data.capacity(),
            Room::Lent(_) => 0,
        }
    }

    /// The caller's [`RecvTarget::buffer_len`] for a lent target; 0 for
    /// the engine's own buffer.
    pub(super) fn buffer_len(&self) -> u64 {
        match self {
            Room::Owned(_) => 0,
            Room::Lent(posted) => posted.buffer_len,
        }
    }

    pub(super) fn posted_id(&self) -> Option<PostId> {
        match self {
            Room::Owned(_) => None,
            Room::Lent(posted) => Some(posted.id),
        }
    }
}

/// Targets posted and not yet taken by a message, oldest first.
#[derive(Debug, Default)]
pub(super) struct Posted {
    queue: VecDeque<PostedRecv>,
    next_id: u64,
}

impl Posted {
    pub(super) fn post(&mut self, target: Box<dyn RecvTarget>) -> PostId {
        self.next_id += 1;
        let id = PostId(self.next_id);
        self.queue.push_back(PostedRecv::new(id, target));
        id
    }

    /// The first target, if message `msg_id` of `len` bytes fits it (and,
    /// for a combining target, is the one it names).
    pub(super) fn take_if_fits(&mut self, msg_id: u64, len: usize) -> Option<PostedRecv> {
        if self
            .queue
            .front()
            .is_some_and(|posted| posted.takes(msg_id, len))
        {
            self.queue.pop_front()
        } else {
            None
        }
    }

    /// Whether the first target is a combining one.
    pub(super) fn front_combines(&self) -> bool {
        self.queue.front().is_some_and(PostedRecv::is_combining)
    }

    /// After a session reset: no combining target takes a message again.
    pub(super) fn spoil_combining(&mut self) {
        for posted in &mut self.queue {
            posted.spoiled |= posted.combines.is_some();
        }
    }

    /// The first target's [`RecvTarget::buffer_len`] (0 when none is
    /// posted).
    pub(super) fn front_buffer_len(&self) -> u64 {
        self.queue.front().map_or(0, |posted| posted.buffer_len)
    }

    /// A target a message took and did not keep goes back to the front:
    /// it was the first when taken, and targets are taken in order.
    pub(super) fn put_back(&mut self, posted: PostedRecv) {
        self.queue.push_front(posted);
    }

    pub(super) fn remove(&mut self, id: PostId) -> Option<PostedRecv> {
        let at = self.queue.iter().position(|posted| posted.id == id)?;
        self.queue.remove(at)
    }

    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(super) fn ids(&self) -> Vec<PostId> {
        self.queue.iter().map(|posted| posted.id).collect()
    }
}
