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
//! A target may name the one message it takes ([`RecvTarget::message`]):
//! then a message that passed it by in the engine's memory does not shift
//! the later targets onto the wrong messages. Each takes its own, and one
//! whose message has gone by takes nothing more until the caller takes it
//! back.
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

    /// For a target that takes bytes: the one message it takes (the id
    /// the engine will deliver it under, see `Engine::next_message_id`),
    /// if it fits. Other messages pass it by, and it stays posted. `None`
    /// (the default): the next message in order that fits, whichever it
    /// is. Ignored on a combining target, which names its message in
    /// [`RecvTarget::combines`].
    fn message(&self) -> Option<MessageId> {
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
    /// The one message it takes ([`RecvTarget::combines`], else
    /// [`RecvTarget::message`]), as it was when posted.
    names: Option<MessageId>,
    /// Whether it folds its message in ([`RecvTarget::combines`]).
    combining: bool,
    /// A target naming a message that a session reset passed over: the
    /// new session numbers its messages anew, so it takes none (and a
    /// combining one may hold part of a message that will never finish).
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
            names: combines.or_else(|| target.message()),
            combining: combines.is_some(),
            spoiled: false,
            target,
        }
    }

    /// Whether this target folds its message in (see
    /// [`RecvTarget::combines`]).
    pub fn is_combining(&self) -> bool {
        self.combining
    }

    /// Whether the message `msg_id`, `len` bytes, may be assembled here: a
    /// target that names a message takes only that one, and a combining
    /// target only of its own length (one of another is left to the
    /// caller to refuse before anything of it is folded in).
    pub(super) fn takes(&self, msg_id: u64, len: usize) -> bool {
        match self.names {
            None => self.len >= len,
            Some(_) if self.spoiled => false,
            Some(id) if self.combining => id.0 == msg_id && self.len == len,
            Some(id) => id.0 == msg_id && self.len >= len,
        }
    }

    /// Whether the target can take no message from `msg_id` on: it names
    /// an earlier one, or a session reset spoiled it. Messages start in
    /// order, so a later one may be assembled in a target behind it. Ids
    /// wrap (a peer's first may be any): "earlier" is within half the id
    /// space behind.
    fn passed_by(&self, msg_id: u64) -> bool {
        self.names.is_some_and(|id| {
            let behind = msg_id.wrapping_sub(id.0);
            self.spoiled || (behind != 0 && behind < 1 << 63)
        })
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

    /// Where in the queue message `msg_id` looks for its target: the
    /// first target not passed by (see [`PostedRecv::passed_by`]).
    fn next_for(&self, msg_id: u64) -> Option<usize> {
        self.queue
            .iter()
            .position(|posted| !posted.passed_by(msg_id))
    }

    /// The next target for message `msg_id`, if the message, `len` bytes,
    /// fits it (and is the one it names, if it names one).
    pub(super) fn take_if_fits(&mut self, msg_id: u64, len: usize) -> Option<PostedRecv> {
        let at = self.next_for(msg_id)?;
        if self.queue[at].takes(msg_id, len) {
            self.queue.remove(at)
        } else {
            None
        }
    }

    /// Whether the next target for message `msg_id` is a combining one.
    pub(super) fn next_combines(&self, msg_id: u64) -> bool {
        self.next_for(msg_id)
            .is_some_and(|at| self.queue[at].is_combining())
    }

    /// After a session reset: no target that names a message takes one
    /// again (the new session numbers its messages anew).
    pub(super) fn spoil_named(&mut self) {
        for posted in &mut self.queue {
            posted.spoiled |= posted.names.is_some();
        }
    }

    /// The first target's [`RecvTarget::buffer_len`] (0 when none is
    /// posted).
    pub(super) fn front_buffer_len(&self) -> u64 {
        self.queue.front().map_or(0, |posted| posted.buffer_len)
    }

    /// Puts a target a message took and did not keep back where it was
    /// in line (posts are numbered in order).
    pub(super) fn put_back(&mut self, posted: PostedRecv) {
        let at = self
            .queue
            .iter()
            .position(|queued| queued.id > posted.id)
            .unwrap_or(self.queue.len());
        self.queue.insert(at, posted);
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Names(Option<MessageId>, Vec<u8>);

    impl RecvTarget for Names {
        fn bytes_mut(&mut self) -> &mut [u8] {
            &mut self.1
        }
        fn message(&self) -> Option<MessageId> {
            self.0
        }
    }

    fn queue(names: &[Option<u64>]) -> Posted {
        let mut posted = Posted::default();
        for name in names {
            posted.post(Box::new(Names(name.map(MessageId), vec![0; 100])));
        }
        posted
    }

    /// Ids wrap: a peer's first message may carry any. A target naming
    /// the id before the wrap is passed by the one after it, not waited on.
    #[test]
    fn targets_named_across_the_id_wrap_stay_in_step() {
        let mut posted = queue(&[Some(u64::MAX), Some(0), Some(1)]);
        assert_eq!(
            posted.take_if_fits(u64::MAX, 10).map(|p| p.id()),
            Some(PostId(1))
        );
        // u64::MAX's target gone by, 0's takes 0 across the wrap.
        let mut posted_late = queue(&[Some(u64::MAX), Some(0)]);
        assert_eq!(
            posted_late.take_if_fits(0, 10).map(|p| p.id()),
            Some(PostId(2))
        );
        assert_eq!(posted.take_if_fits(1, 10).map(|p| p.id()), Some(PostId(3)));
        assert_eq!(posted.len(), 1, "0's target waits for the caller");
    }

    /// A target that names no message takes the next that fits; those
    /// behind it that name messages take theirs, and one whose message
    /// went by elsewhere is passed over.
    #[test]
    fn unnamed_and_named_targets_share_a_line() {
        let mut posted = queue(&[None, Some(8), Some(9), Some(10)]);
        assert_eq!(posted.take_if_fits(7, 10).map(|p| p.id()), Some(PostId(1)));
        assert!(posted.take_if_fits(8, 500).is_none(), "too long for it");
        assert_eq!(posted.take_if_fits(9, 10).map(|p| p.id()), Some(PostId(3)));
        let back = posted.take_if_fits(10, 10).unwrap();
        posted.post(Box::new(Names(None, vec![0; 100])));
        posted.put_back(back);
        assert_eq!(
            posted.ids(),
            vec![PostId(2), PostId(4), PostId(5)],
            "back where it was"
        );
    }
}
