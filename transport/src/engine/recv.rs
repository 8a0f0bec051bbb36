//! The receiving half: duplicate suppression, buffering ahead of a gap,
//! reassembly, in-order delivery, and the acknowledgement state sent back.
//!
//! Every fragment is checked against the message it joins before its bytes
//! are appended; a peer whose fragments contradict each other (with a valid
//! CRC, so not line noise) is a protocol violation that ends the link,
//! because the only alternatives are delivering something wrong or waiting
//! forever.

use std::collections::{BTreeMap, VecDeque};

use super::config::EngineConfig;
use super::error::{PacketError, Violation};
use super::posted::{PostId, Posted, PostedRecv, RecvTarget, Room};
use super::stats::Stats;
use crate::time::Time;
use crate::wire::{Fragment, Repr, flags};

/// NAKs held back at most; a burst of corruption longer than this is left
/// to the sender's retransmission timer.
const MAX_PENDING_NAKS: usize = 16;

/// The transmission serial `count` sends after `xmit`; serials skip 0 when
/// they wrap (0 names "nothing yet").
fn xmit_after(xmit: u32, count: u32) -> u32 {
    let next = xmit.wrapping_add(count);
    if next < xmit || next == 0 {
        next.wrapping_add(1)
    } else {
        next
    }
}

/// A fragment that arrived ahead of a gap.
#[derive(Debug)]
struct Buffered {
    fragment: Fragment,
    held: Held,
}

/// Where a fragment that arrived ahead of a gap waits.
#[derive(Debug)]
enum Held {
    /// A copy of its payload (it belongs to a later message).
    Bytes(Vec<u8>),
    /// Its payload, this long, is already at its place in the message being
    /// assembled (put there by [`Receiver::place`]).
    InPlace(usize),
}

/// The message being put together from in-order fragments.
#[derive(Debug)]
struct Assembly {
    msg_id: u64,
    msg_len: u64,
    count: u32,
    next_index: u32,
    /// Payload size of every fragment but the last.
    frag_size: usize,
    /// The message so far is `data[..filled]`. Bytes beyond are initialized
    /// room (a recycled buffer keeps its old length, so steady state never
    /// zeroes memory), where the next fragment may already have been copied
    /// before its CRC was checked.
    data: Room,
    filled: usize,
    /// Its combining target was taken back midway (`Receiver::unpost`):
    /// the rest arrives and is dropped, never delivered, as the start is
    /// folded into memory the caller took back.
    discard: bool,
}

impl Assembly {
    /// A message whose first fragment (`len` bytes) is or will be at the
    /// start of `data`, nothing of it consumed yet.
    fn first(fragment: &Fragment, len: usize, data: Room) -> Assembly {
        Assembly {
            msg_id: fragment.msg_id,
            msg_len: fragment.msg_len,
            count: fragment.count,
            next_index: 0,
            frag_size: len,
            data,
            filled: 0,
            discard: false,
        }
    }

    /// Where `fragment` (`len` bytes of a message of `limit` bytes) goes in
    /// this message, made room for: at `index * frag_size`, if it belongs
    /// to this message and is sized as its others. Whether its sequence
    /// number fits its index is the caller's check.
    fn room_for(&mut self, fragment: &Fragment, len: usize, limit: usize) -> Option<&mut [u8]> {
        let same_message = fragment.msg_id == self.msg_id
            && fragment.msg_len == self.msg_len
            && fragment.count == self.count;
        let sized = len == self.frag_size || fragment.is_last();
        if !(same_message && sized) || self.frag_size == 0 || !self.data.takes_placement() {
            return None;
        }
        let start = usize::try_from(fragment.index)
            .ok()?
            .checked_mul(self.frag_size)?;
        let end = start.checked_add(len)?;
        if end > limit || (fragment.is_last() && end != limit) {
            return None;
        }
        self.data.make_room(end, end, limit).ok()?;
        Some(&mut self.data.bytes_mut()[start..end])
    }
}

/// Why a fragment's payload could not join its message.
enum Appended {
    /// Memory for this many bytes could not be had.
    OutOfMemory(usize),
    /// `place` was said to have put it where it is not.
    NotPlaced,
}

impl Assembly {
    /// Adds the next fragment's payload, which ends at `end` of a message
    /// of `msg_len`: copied (or folded into a combining target), or
    /// checked to be where `place` put it.
    fn append(&mut self, payload: Payload<'_>, end: usize, msg_len: usize) -> Result<(), Appended> {
        match payload {
            Payload::Bytes(bytes) => {
                // Reserve what a few dozen fragments bring, not what the
                // peer claims: memory follows data actually received.
                let want = if self.filled == 0 {
                    first_reservation(msg_len, bytes.len())
                } else {
                    end
                };
                self.data
                    .make_room(end, want, msg_len)
                    .map_err(Appended::OutOfMemory)?;
                match &mut self.data {
                    Room::Lent(posted) if posted.is_combining() => {
                        posted.combine(self.filled, bytes);
                    }
                    data => data.bytes_mut()[self.filled..end].copy_from_slice(bytes),
                }
                Ok(())
            }
            Payload::Placed(_) if self.data.len() >= end && self.data.takes_placement() => Ok(()),
            Payload::Placed(_) => Err(Appended::NotPlaced),
        }
    }
}

/// A message after the one being assembled whose first fragment arrived
/// ahead of a gap: its fragments are placed in it as they come, so that
/// when the gap fills it is complete without another copy.
#[derive(Debug)]
struct Later {
    /// Sequence number of its first fragment.
    first_seq: u64,
    assembly: Assembly,
}

impl Later {
    /// Whether `fragment`, the first of its message, carried by `seq`, is
    /// the one this was started with (or its retransmission).
    fn started_by(&self, seq: u64, fragment: &Fragment, len: usize) -> bool {
        self.first_seq == seq
            && fragment.index == 0
            && self.assembly.msg_len == fragment.msg_len
            && self.assembly.count == fragment.count
            && self.assembly.frag_size == len
    }
}

/// Most messages assembled ahead of a gap at once; beyond, their fragments
/// are held as copies.
const MAX_LATER_MESSAGES: usize = 64;

/// Where a data packet's payload is.
#[derive(Debug, Clone, Copy)]
pub(super) enum Payload<'a> {
    /// In a buffer of its own.
    Bytes(&'a [u8]),
    /// Already copied, this many bytes, to where [`Receiver::place`] said.
    Placed(usize),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Bytes(bytes) => bytes.len(),
            Payload::Placed(len) => *len,
        }
    }
}

/// A message complete and ready for the caller.
#[derive(Debug)]
pub(super) struct Completed {
    pub(super) msg_id: u64,
    /// The message is `data`'s first `len` bytes.
    pub(super) data: Room,
    pub(super) len: usize,
    pub(super) packets: u32,
}

#[derive(Debug, Default)]
pub(super) struct Receiver {
    /// Every sequence number below this arrived and was consumed in order.
    next_seq: u64,
    ahead: BTreeMap<u64, Buffered>,
    ahead_bytes: usize,
    assembly: Option<Assembly>,
    /// Messages after `assembly` begun ahead of a gap, by message id.
    later: BTreeMap<u64, Later>,
    /// The buffer [`Receiver::place`] put the first fragment of a later
    /// message in, with that packet's sequence number, until the packet is
    /// taken (or another takes its place).
    ahead_staged: Option<(u64, Vec<u8>)>,
    /// The id the next message must carry (learned from the session's first).
    expected_msg_id: Option<u64>,
    /// Packets of delivered messages the caller has not taken yet; they
    /// count against the credit so that a slow caller stops the sender.
    pub(super) undelivered_packets: u64,
    pub(super) undelivered_bytes: usize,
    unacked_packets: u32,
    ack_deadline: Option<Time>,
    /// An acknowledgement should go out at the next chance, not held for
    /// an answer (a gap, a duplicate, a window update, a new peer).
    pub(super) ack_now: bool,
    /// The peer asked for an acknowledgement (it is about to wait): due
    /// now, but an answer about to go may carry it.
    ack_requested: bool,
    /// ... by the packet before a message's tail: its sender waits to learn
    /// what of the message it still needs (`Engine::ack_before_tail`).
    ack_requested_before_tail: bool,
    /// Serial of the last intact packet from the peer (0: none yet).
    last_intact_xmit: u32,
    /// Corrupt packets since the last intact one.
    corrupt_run: u32,
    /// NAKs arranged since the last intact packet; capped, so that garbage
    /// is not answered with packets forever.
    naks_since_intact: u32,
    /// Transmission serials believed corrupt, to NAK (bounded: beyond it
    /// the sender's timer recovers).
    naks: VecDeque<u32>,
    /// The highest sequence number (exclusive) ever offered to the peer.
    /// It never moves back, as TCP never shrinks its window: the peer may
    /// have sent up to it already when a message completes and its packets
    /// start counting against the credit.
    window_edge: u64,
    /// Delivered buffers the caller gave back, reused for assembly.
    spares: Spares,
    /// The buffer the next message starts in, once [`Receiver::place`] has
    /// copied its first fragment there.
    staged: Option<Room>,
    /// Targets the caller lent for the next messages.
    posted: Posted,
}

/// Given-back buffers are kept while they hold at most this many receive
/// windows' worth of bytes: enough that a full window of messages can be
/// assembled without allocating (and zeroing) memory, while memory stays
/// bounded by what the credit lets the peer send anyway.
const SPARE_WINDOWS: usize = 2;

/// Fragments' worth of memory reserved when a message starts.
const INITIAL_RESERVATION_FRAGMENTS: usize = 64;

/// Bytes to allocate for a message of `msg_len` whose first fragment
/// carries `first_len`.
fn first_reservation(msg_len: usize, first_len: usize) -> usize {
    msg_len.min(
        first_len
            .max(1)
            .saturating_mul(INITIAL_RESERVATION_FRAGMENTS),
    )
}

/// A lent target staged for a message (by a packet that then failed its
/// CRC) goes back among the posted ones if the message now starting,
/// `msg_id` of `msg_len` bytes, is not one it takes (it does not fit, or
/// the target names another): an owned buffer grows, a lent one cannot.
/// Nothing counted is in it yet.
fn release_if_unfit(staged: &mut Option<Room>, posted: &mut Posted, msg_id: u64, msg_len: usize) {
    if matches!(staged, Some(Room::Lent(lent)) if !lent.takes(msg_id, msg_len))
        && let Some(Room::Lent(lent)) = staged.take()
    {
        posted.put_back(lent);
    }
}

/// Where message `msg_id`, `len` bytes, is assembled: the next posted
/// target for it (the first not passed by) if the message fits it and it
/// names none or this one, else a spare buffer.
fn room_for_next(posted: &mut Posted, spares: &mut Spares, msg_id: u64, len: usize) -> Room {
    match posted.take_if_fits(msg_id, len) {
        Some(lent) => Room::Lent(lent),
        None => Room::Owned(spares.take(len)),
    }
}

/// Makes `data[..need]` initialized room, reporting allocation failure
/// instead of aborting. A new allocation takes `want` bytes (at least
/// `need`); later ones double, never past `limit` (the message length), so
/// memory follows the data that actually arrives.
pub(super) fn make_room(
    data: &mut Vec<u8>,
    need: usize,
    want: usize,
    limit: usize,
) -> Result<(), usize> {
    if data.len() >= need {
        return Ok(());
    }
    if data.capacity() < need {
        let target = if data.capacity() == 0 {
            want
        } else {
            limit.min(data.capacity().saturating_mul(2))
        }
        .max(need);
        data.try_reserve_exact(target - data.len())
            .map_err(|_| target)?;
    }
    data.resize(need, 0);
    Ok(())
}

/// Delivered buffers the caller gave back, kept to assemble later
/// messages in, with their capacities' total (kept as they come and go:
/// a buffer is given back for every message).
#[derive(Debug, Default)]
struct Spares {
    /// Oldest first.
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl Spares {
    /// A buffer to assemble a message of `len` bytes in: the one given
    /// back last if it is large enough (the usual case: messages of one
    /// size), else the largest one kept, else a new one. Growing a small
    /// buffer to a large message costs a reallocation, page faults and
    /// zeroing for every message (16 MiB messages after a run of smaller
    /// ones went at half speed while the spares of the earlier size
    /// lasted).
    fn take(&mut self, len: usize) -> Vec<u8> {
        let newest_fits = self.buffers.last().is_some_and(|b| b.capacity() >= len);
        let at = if newest_fits {
            self.buffers.len().checked_sub(1)
        } else {
            (0..self.buffers.len()).max_by_key(|&i| self.buffers[i].capacity())
        };
        let Some(at) = at else {
            return Vec::new();
        };
        let buf = self.buffers.swap_remove(at);
        self.bytes -= buf.capacity();
        buf
    }

    /// Keeps `buf` (its bytes stay as initialized room, see
    /// `Assembly::data`) among at most `max_count` spares of at most
    /// `max_bytes` in all. Over the limits the oldest spares go and the
    /// newest stays, whatever its size: a message that large just arrived
    /// (its memory was spent anyway), and the next is likely its size, not
    /// that of the spares before it. A caller moving messages larger than
    /// the window would otherwise get a freshly allocated buffer for each,
    /// and the page faults of 16 MiB stall the receiver for longer than the
    /// sender's retransmission timer.
    fn keep(&mut self, buf: Vec<u8>, max_bytes: usize, max_count: usize) {
        self.bytes += buf.capacity();
        self.buffers.push(buf);
        let mut evict = 0;
        while evict + 1 < self.buffers.len()
            && (self.bytes > max_bytes || self.buffers.len() - evict > max_count)
        {
            self.bytes -= self.buffers[evict].capacity();
            evict += 1;
        }
        self.buffers.drain(..evict);
    }
}

impl Receiver {
    /// An intact packet from the current peer arrived.
    pub(super) fn on_intact(&mut self, xmit: u32) {
        self.last_intact_xmit = xmit;
        self.corrupt_run = 0;
        self.naks_since_intact = 0;
    }

    /// A packet arrived corrupt. On a medium that keeps order (rings, RDMA
    /// RC) it is the transmission right after the last intact one, counting
    /// the corrupt ones in between; that is the serial the NAK names.
    pub(super) fn on_corrupt(&mut self) {
        self.corrupt_run = self.corrupt_run.wrapping_add(1);
        if self.naks_since_intact >= MAX_PENDING_NAKS as u32 {
            // Nothing intact for a while: NAKing more would only answer
            // garbage with packets (a storm, if the peer NAKs ours too).
            return;
        }
        self.naks_since_intact += 1;
        if self.naks.len() == MAX_PENDING_NAKS {
            self.naks.pop_front();
        }
        self.naks
            .push_back(xmit_after(self.last_intact_xmit, self.corrupt_run));
    }

    pub(super) fn nak_pending(&self) -> bool {
        !self.naks.is_empty()
    }

    /// The next transmission serial to NAK.
    #[inline]
    pub(super) fn take_nak(&mut self) -> Option<u32> {
        self.naks.pop_front()
    }

    /// The cumulative acknowledgement: every sequence number below arrived.
    pub(super) fn ack(&self) -> u64 {
        self.next_seq
    }

    /// Bit `i` set: `ack() + 1 + i` is buffered.
    #[inline]
    pub(super) fn sack(&self) -> u64 {
        let first = self.next_seq + 1;
        self.ahead
            .range(first..first + 64)
            .fold(0, |bits, (&seq, _)| bits | 1 << (seq - first))
    }

    /// Packets beyond `ack()` this side will accept: what the receive
    /// window has room for now, and never less than was offered before.
    #[inline]
    pub(super) fn credit(&self, config: &EngineConfig) -> u32 {
        let held = u32::try_from(self.undelivered_packets).unwrap_or(u32::MAX);
        let room = config.recv_window.saturating_sub(held);
        let promised = self.window_edge.saturating_sub(self.next_seq);
        // The edge is at most recv_window past an earlier ack, so this fits.
        room.max(u32::try_from(promised).unwrap_or(u32::MAX))
    }

    /// Bytes held for the caller or ahead of a gap (memory accounting).
    pub(super) fn buffered_bytes(&self) -> usize {
        let spare = self.spares.bytes + self.staged.as_ref().map_or(0, Room::capacity);
        spare
            + self.ahead_bytes
            + self.undelivered_bytes
            + self.assembly.as_ref().map_or(0, |a| a.data.capacity())
    }

    /// Whether data from the peer waits here for this side's caller:
    /// buffered ahead of a gap, being assembled, or delivered and not yet
    /// taken (spare buffers are not data).
    pub(super) fn holds_data(&self) -> bool {
        self.ahead_bytes > 0 || self.undelivered_bytes > 0 || self.assembly.is_some()
    }

    /// The packet before a message's tail asked for an acknowledgement
    /// that has not gone out yet.
    #[inline]
    pub(super) fn owes_ack_before_tail(&self) -> bool {
        self.ack_requested_before_tail
    }

    pub(super) fn wants_ack(&self, now: Time, config: &EngineConfig) -> bool {
        self.ack_now
            || self.ack_requested
            || self.unacked_packets >= config.ack_threshold()
            || self.ack_deadline.is_some_and(|deadline| now >= deadline)
    }

    /// Whether an acknowledgement that is due may wait a little: a message
    /// was just delivered and the caller has not taken it yet, so its answer
    /// (which carries the acknowledgement, as every packet does) may be
    /// about to go out. The wait ends when the caller takes the message, at
    /// the ack deadline (`ack_delay` after the data arrived), or when
    /// [`EngineConfig::ack_threshold`] packets are unacknowledged — so a request/response pair
    /// costs two packets, not four. One packet may always wait: a window
    /// under 8 packets has a threshold of 1, and its one-packet requests
    /// would each be acknowledged on their own before the answer could
    /// carry it (their credit comes back only when the caller takes them;
    /// the wait holds back the sender's in-flight slot, for `ack_delay` at
    /// most). An acknowledgement that reports a gap, a duplicate or a
    /// window update never waits.
    pub(super) fn may_hold_ack(&self, now: Time, config: &EngineConfig) -> bool {
        self.undelivered_packets > 0
            && !self.ack_now
            && self.unacked_packets < config.ack_threshold().max(2)
            && self.naks.is_empty()
            && self.ack_deadline.is_some_and(|deadline| now < deadline)
    }

    pub(super) fn ack_deadline(&self) -> Option<Time> {
        self.ack_deadline
    }

    /// Every outgoing packet carries the acknowledgement state.
    #[inline]
    pub(super) fn on_ack_sent(&mut self, credit: u32) {
        self.ack_now = false;
        self.ack_requested = false;
        self.ack_requested_before_tail = false;
        self.unacked_packets = 0;
        self.ack_deadline = None;
        self.window_edge = self.window_edge.max(self.next_seq + u64::from(credit));
    }

    /// The caller took a delivered message: its packets free credit. If the
    /// peer may be waiting for credit, tell it now.
    #[inline]
    pub(super) fn on_taken(&mut self, packets: u32, bytes: usize, config: &EngineConfig) {
        self.undelivered_packets -= u64::from(packets);
        self.undelivered_bytes -= bytes;
        // Tell the peer when the window opens by half or more beyond what it
        // was offered: it may be waiting for exactly that.
        let edge_now = self.next_seq + u64::from(self.credit(config));
        if edge_now >= self.window_edge + u64::from(config.recv_window / 2) {
            self.ack_now = true;
        }
    }

    /// The length of the buffer a packet of message `msg_id` lands as
    /// part of, when that is a lent range of a larger buffer: the
    /// message's assembly, else the room the next message would take.
    /// Only a hint for how the medium writes, never for where: after a
    /// loss it may name the room of another message than the one the
    /// packet lands in.
    #[inline]
    pub(super) fn landing_buffer_len(&self, msg_id: u64) -> u64 {
        match (&self.assembly, &self.staged) {
            (Some(assembly), _) if assembly.msg_id == msg_id => assembly.data.buffer_len(),
            (Some(_), _) => 0,
            (None, Some(staged)) => staged.buffer_len(),
            (None, None) => self.posted.front_buffer_len(),
        }
    }

    /// Where the payload of data packet `repr` can be copied so that it
    /// is part of its message without another copy: `Some` only when the
    /// packet is the next one in order, within the window, and fits the
    /// message being assembled (or starts the next one). The bytes copied
    /// there count only once [`Receiver::on_data`] takes the packet with
    /// [`Payload::Placed`]; until then they are room, overwritten later.
    #[inline]
    pub(super) fn place(&mut self, repr: &Repr, config: &EngineConfig) -> Option<&mut [u8]> {
        let fragment = repr.fragment?;
        let len = repr.payload_len as usize;
        let window_end = self.next_seq + u64::from(self.credit(config));
        if repr.seq < self.next_seq || repr.seq >= window_end {
            return None;
        }
        let limit = usize::try_from(fragment.msg_len).ok()?;
        if repr.seq > self.next_seq {
            return self.place_ahead(repr.seq, &fragment, len, limit);
        }
        match &mut self.assembly {
            Some(assembly) => {
                let end = assembly.filled.checked_add(len)?;
                let fits = fragment.msg_id == assembly.msg_id
                    && fragment.index == assembly.next_index
                    && end <= limit
                    && assembly.data.takes_placement();
                if !fits {
                    return None;
                }
                assembly.data.make_room(end, end, limit).ok()?;
                Some(&mut assembly.data.bytes_mut()[assembly.filled..end])
            }
            None => {
                if fragment.index != 0 || len > limit {
                    return None;
                }
                if self
                    .expected_msg_id
                    .is_some_and(|expected| expected != fragment.msg_id)
                {
                    return None;
                }
                if self.later.contains_key(&fragment.msg_id) {
                    // Its first fragment was taken ahead of a gap already:
                    // this is a duplicate, and must not touch that buffer.
                    return None;
                }
                // A combining target next in line is not staged: the
                // packet lands in the engine's buffer and is folded in from
                // there once checked (`consume`). A staged target that does
                // not take this message goes back first, so the one next in
                // line is the one checked.
                let msg_id = fragment.msg_id;
                release_if_unfit(&mut self.staged, &mut self.posted, msg_id, limit);
                if self.staged.is_none() && self.posted.next_combines(msg_id) {
                    return None;
                }
                let (posted, spares) = (&mut self.posted, &mut self.spares);
                let data = self
                    .staged
                    .get_or_insert_with(|| room_for_next(posted, spares, msg_id, limit));
                data.make_room(len, first_reservation(limit, len), limit)
                    .ok()?;
                Some(&mut data.bytes_mut()[..len])
            }
        }
    }

    /// Room for a fragment that arrived ahead of a gap but belongs to the
    /// message being assembled: its place there (fragment `i` starts at
    /// `i * frag_size`), so that when the gap fills nothing is copied again.
    /// Only where its sequence number and index agree and nothing arrived
    /// for it yet; the bytes between are room no received fragment uses.
    fn place_ahead(
        &mut self,
        seq: u64,
        fragment: &Fragment,
        len: usize,
        limit: usize,
    ) -> Option<&mut [u8]> {
        if self.ahead.contains_key(&seq) {
            return None;
        }
        if !self.assembling(fragment.msg_id) {
            return self.place_later(seq, fragment, len, limit);
        }
        let next_seq = self.next_seq;
        let assembly = self.assembly.as_mut()?;
        let index_matches = fragment.index > assembly.next_index
            && u64::from(fragment.index - assembly.next_index) == seq - next_seq;
        if !index_matches {
            return None;
        }
        assembly.room_for(fragment, len, limit)
    }

    /// Room for a fragment of a message after the one being assembled,
    /// ahead of a gap. A first fragment goes into a buffer of its own
    /// (`ahead_staged`), which becomes a [`Later`] once the packet passed
    /// its CRC ([`Receiver::on_data`]); memory for that fragment only,
    /// growing as the rest arrives, so a peer cannot make us reserve more
    /// than it sends. The others go where their index says in their
    /// message's `Later`, as in [`Receiver::place_ahead`] — only into one
    /// that an intact first fragment began.
    fn place_later(
        &mut self,
        seq: u64,
        fragment: &Fragment,
        len: usize,
        limit: usize,
    ) -> Option<&mut [u8]> {
        if fragment.index == 0 {
            if len > limit
                || (fragment.is_last() && len != limit)
                || self.later.contains_key(&fragment.msg_id)
                || self.later.len() >= MAX_LATER_MESSAGES
            {
                return None;
            }
            let mut data = match self.ahead_staged.take() {
                Some((_, data)) => data,
                None => self.spares.take(limit),
            };
            make_room(&mut data, len, len, limit).ok()?;
            let (_, data) = self.ahead_staged.insert((seq, data));
            return Some(&mut data[..len]);
        }
        let later = self.later.get_mut(&fragment.msg_id)?;
        if seq.checked_sub(later.first_seq) != Some(u64::from(fragment.index)) {
            return None;
        }
        later.assembly.room_for(fragment, len, limit)
    }

    /// Whether `msg_id` is the message being assembled.
    fn assembling(&self, msg_id: u64) -> bool {
        self.assembly
            .as_ref()
            .is_some_and(|assembly| assembly.msg_id == msg_id)
    }

    /// The intact first fragment `seq` (`len` bytes, in `data`, where
    /// `place` staged it) of a later message begins that message's
    /// [`Later`]. `place` staged it only if there was room for one more
    /// and none for this message yet; if that ever changed in between, the
    /// fragment is held as a copy instead (never over an existing one).
    fn begin_later(
        &mut self,
        seq: u64,
        fragment: &Fragment,
        len: usize,
        mut data: Vec<u8>,
    ) -> Held {
        if self.later.len() >= MAX_LATER_MESSAGES || self.later.contains_key(&fragment.msg_id) {
            data.truncate(len);
            self.ahead_bytes += len;
            return Held::Bytes(data);
        }
        let assembly = Assembly::first(fragment, len, Room::Owned(data));
        self.later.insert(
            fragment.msg_id,
            Later {
                first_seq: seq,
                assembly,
            },
        );
        Held::InPlace(len)
    }

    /// A data packet that passed the wire checks, from the current session.
    pub(super) fn on_data(
        &mut self,
        now: Time,
        repr: &Repr,
        payload: Payload<'_>,
        config: &EngineConfig,
        stats: &mut Stats,
        mut deliver: impl FnMut(Completed),
    ) -> Result<(), PacketError> {
        let seq = repr.seq;
        let fragment = repr
            .fragment
            .expect("the parser gives every data packet a fragment");
        if seq < self.next_seq || self.ahead.contains_key(&seq) {
            stats.duplicates += 1;
            // Our acknowledgement may have been lost: repeat it.
            self.ack_now = true;
            return Ok(());
        }
        let window_end = self.next_seq + u64::from(self.credit(config));
        if seq >= window_end {
            stats.credit_violations += 1;
            self.ack_now = true;
            return Err(PacketError::OutsideWindow {
                seq,
                window_start: self.next_seq,
                window_end,
            });
        }
        stats.payload_bytes_received += payload.len() as u64;
        if seq == self.next_seq {
            self.consume(seq, &fragment, payload, &mut deliver)?;
            let mut filled_gap = false;
            while let Some(buffered) = self.ahead.remove(&self.next_seq) {
                filled_gap = true;
                match buffered.held {
                    Held::Bytes(bytes) => {
                        self.ahead_bytes -= bytes.len();
                        if self.assembly.is_none()
                            && buffered.fragment.index == 0
                            && !self.later.contains_key(&buffered.fragment.msg_id)
                        {
                            // It starts the next message: its buffer becomes
                            // that message's, with the fragment already at
                            // the front (no second copy).
                            let len = bytes.len();
                            if let Some(unused) = self.staged.replace(Room::Owned(bytes)) {
                                self.release(unused, config);
                            }
                            self.consume(
                                self.next_seq,
                                &buffered.fragment,
                                Payload::Placed(len),
                                &mut deliver,
                            )?;
                        } else {
                            self.consume(
                                self.next_seq,
                                &buffered.fragment,
                                Payload::Bytes(&bytes),
                                &mut deliver,
                            )?;
                            self.recycle(bytes, config);
                        }
                    }
                    Held::InPlace(len) => self.consume(
                        self.next_seq,
                        &buffered.fragment,
                        Payload::Placed(len),
                        &mut deliver,
                    )?,
                }
            }
            if filled_gap {
                self.ack_now = true;
            }
        } else {
            stats.out_of_order += 1;
            let held = match payload {
                Payload::Bytes(bytes) => {
                    self.ahead_bytes += bytes.len();
                    // A given-back buffer if there is one: after a lost
                    // packet, a ring's worth of packets comes in ahead of
                    // its retransmission, and allocating for each of them
                    // made a corrupt packet cost far more than its resend.
                    let mut held = self.spares.take(bytes.len());
                    held.clear();
                    held.extend_from_slice(bytes);
                    Held::Bytes(held)
                }
                Payload::Placed(len) => match self.ahead_staged.take() {
                    // `place` put the first fragment of a later message in
                    // a buffer of its own: it begins that message. (Only a
                    // first fragment goes there; the buffer may still hold
                    // a corrupt packet that claimed this sequence number,
                    // so the number alone does not say it is this one's.)
                    Some((staged_seq, data))
                        if staged_seq == seq
                            && fragment.index == 0
                            && !self.assembling(fragment.msg_id) =>
                    {
                        self.begin_later(seq, &fragment, len, data)
                    }
                    other => {
                        self.ahead_staged = other;
                        // `place_ahead` put it where it belongs in its
                        // message (the one being assembled or a later one).
                        Held::InPlace(len)
                    }
                },
            };
            self.ahead.insert(seq, Buffered { fragment, held });
            // Tell the sender about the gap at once (selective ack).
            self.ack_now = true;
        }
        self.unacked_packets += 1;
        if repr.flags & flags::ACK_REQUESTED != 0 {
            self.ack_requested = true;
            self.ack_requested_before_tail |= Some(fragment.index)
                == super::send::before_tail_index(fragment.msg_len, config.max_payload_len());
        }
        if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + config.ack_delay);
        }
        Ok(())
    }

    /// Appends the in-order fragment `seq` to its message.
    fn consume(
        &mut self,
        seq: u64,
        fragment: &Fragment,
        payload: Payload<'_>,
        deliver: &mut impl FnMut(Completed),
    ) -> Result<(), PacketError> {
        let violation = |detail| Err(PacketError::Violation { seq, detail });
        let len = payload.len();
        let out_of_memory = |bytes| PacketError::OutOfMemory {
            seq,
            msg_id: fragment.msg_id,
            bytes,
        };
        let assembly = match &mut self.assembly {
            None => {
                if fragment.index != 0 {
                    return violation(Violation::MessageStartsMidway {
                        msg_id: fragment.msg_id,
                        index: fragment.index,
                    });
                }
                if let Some(expected) = self.expected_msg_id
                    && fragment.msg_id != expected
                {
                    return violation(Violation::UnexpectedMessageId {
                        expected,
                        found: fragment.msg_id,
                    });
                }
                // A message begun ahead of a gap has its fragments in place
                // (its first one too, if placed: `place` put it there); a
                // placed first fragment of any other is at the start of the
                // staged buffer.
                let data = match self.later.remove(&fragment.msg_id) {
                    Some(later) if later.started_by(seq, fragment, len) => later.assembly.data,
                    stale => {
                        // Begun by a packet that is not this one: nothing
                        // of it counts (`place` did not use it either).
                        drop(stale);
                        let msg_len = usize::try_from(fragment.msg_len).unwrap_or(usize::MAX);
                        release_if_unfit(
                            &mut self.staged,
                            &mut self.posted,
                            fragment.msg_id,
                            msg_len,
                        );
                        match self.staged.take() {
                            Some(data) => data,
                            None => room_for_next(
                                &mut self.posted,
                                &mut self.spares,
                                fragment.msg_id,
                                usize::try_from(fragment.msg_len).unwrap_or(usize::MAX),
                            ),
                        }
                    }
                };
                self.assembly.insert(Assembly::first(fragment, len, data))
            }
            Some(assembly) => {
                if fragment.msg_id != assembly.msg_id
                    || fragment.msg_len != assembly.msg_len
                    || fragment.count != assembly.count
                {
                    return violation(Violation::FragmentOfAnotherMessage {
                        expected_msg_id: assembly.msg_id,
                        found_msg_id: fragment.msg_id,
                    });
                }
                if fragment.index != assembly.next_index {
                    return violation(Violation::FragmentOutOfPlace {
                        msg_id: assembly.msg_id,
                        expected: assembly.next_index,
                        found: fragment.index,
                    });
                }
                assembly
            }
        };
        // msg_len was checked against max_message_len by the parser, so it
        // fits memory's address space only if it fits usize.
        let msg_len = usize::try_from(assembly.msg_len).unwrap_or(usize::MAX);
        let end = assembly.filled.saturating_add(len);
        let sized = fragment.is_last() || len == assembly.frag_size;
        if end > msg_len || !sized {
            return violation(Violation::FragmentLengthWrong {
                msg_id: assembly.msg_id,
                index: fragment.index,
                payload_len: len,
            });
        }
        match assembly.append(payload, end, msg_len) {
            Ok(()) => {}
            Err(Appended::OutOfMemory(bytes)) => return Err(out_of_memory(bytes)),
            // Cannot happen while `place` and `consume` agree; if it ever
            // did, fail the link rather than deliver a short or stale
            // message.
            Err(Appended::NotPlaced) => {
                return violation(Violation::FragmentLengthWrong {
                    msg_id: assembly.msg_id,
                    index: fragment.index,
                    payload_len: len,
                });
            }
        }
        assembly.filled = end;
        assembly.next_index += 1;
        self.next_seq = seq + 1;
        if fragment.is_last() {
            if assembly.filled != msg_len {
                return violation(Violation::FragmentLengthWrong {
                    msg_id: assembly.msg_id,
                    index: fragment.index,
                    payload_len: len,
                });
            }
            let mut assembly = self.assembly.take().expect("matched above");
            self.expected_msg_id = Some(assembly.msg_id.wrapping_add(1));
            if assembly.discard {
                return Ok(());
            }
            if let Room::Owned(data) = &mut assembly.data {
                data.truncate(assembly.filled);
            }
            self.undelivered_packets += u64::from(assembly.count);
            self.undelivered_bytes += assembly.filled;
            deliver(Completed {
                msg_id: assembly.msg_id,
                data: assembly.data,
                len: assembly.filled,
                packets: assembly.count,
            });
        }
        Ok(())
    }

    /// Keeps a delivered message's buffer to assemble a later one in.
    pub(super) fn recycle(&mut self, buf: Vec<u8>, config: &EngineConfig) {
        // A buffer larger than any message is not worth holding.
        if buf.capacity() as u64 > config.max_message_len.max(1 << 20) {
            return;
        }
        self.spares.keep(
            buf,
            SPARE_WINDOWS * config.recv_window as usize * config.mtu,
            SPARE_WINDOWS * config.recv_window as usize,
        );
    }

    /// Keeps a buffer a message took and did not keep: an owned one as a
    /// spare, a lent one posted again where it was in line.
    fn release(&mut self, room: Room, config: &EngineConfig) {
        match room {
            Room::Owned(buf) => self.recycle(buf, config),
            Room::Lent(posted) => self.posted.put_back(posted),
        }
    }

    /// Every target posted and not yet holding a delivered message.
    pub(super) fn posted_ids(&self) -> Vec<PostId> {
        let mut ids = self.posted.ids();
        ids.extend(self.staged.as_ref().and_then(Room::posted_id));
        ids.extend(self.assembly.as_ref().and_then(|a| a.data.posted_id()));
        ids
    }

    /// Lends `target` for a coming message (see [`super::posted`]).
    pub(super) fn post(&mut self, target: Box<dyn RecvTarget>) -> PostId {
        self.posted.post(target)
    }

    /// Targets posted and not yet holding a delivered message.
    pub(super) fn posted_count(&self) -> usize {
        self.posted.len()
            + usize::from(
                self.staged
                    .as_ref()
                    .is_some_and(|room| room.posted_id().is_some()),
            )
            + usize::from(
                self.assembly
                    .as_ref()
                    .is_some_and(|assembly| assembly.data.posted_id().is_some()),
            )
    }

    /// Takes back target `id` if no delivered message is in it. A message
    /// being assembled in it moves to a buffer of the engine's, with every
    /// byte placed so far, and goes on arriving there.
    pub(super) fn unpost(&mut self, id: PostId) -> Option<PostedRecv> {
        if let Some(posted) = self.posted.remove(id) {
            return Some(posted);
        }
        if self.staged.as_ref().and_then(Room::posted_id) == Some(id) {
            // Room only: nothing counted is in it yet.
            let Some(Room::Lent(posted)) = self.staged.take() else {
                unreachable!("checked above")
            };
            return Some(posted);
        }
        let assembly = self.assembly.as_mut()?;
        if assembly.data.posted_id() != Some(id) {
            return None;
        }
        if !assembly.data.takes_placement() {
            // What arrived is folded into it and cannot be taken out: the
            // rest of the message arrives into memory of the engine's and
            // is dropped.
            assembly.discard = true;
            return match std::mem::replace(&mut assembly.data, Room::Owned(Vec::new())) {
                Room::Lent(posted) => Some(posted),
                Room::Owned(_) => unreachable!("checked above"),
            };
        }
        // Fragments placed ahead of the gap sit anywhere before the
        // message's end: keep all of it.
        let extent = usize::try_from(assembly.msg_len)
            .unwrap_or(usize::MAX)
            .min(assembly.data.len());
        let mut owned = self.spares.take(extent);
        owned.clear();
        owned.extend_from_slice(&assembly.data.bytes_mut()[..extent]);
        match std::mem::replace(&mut assembly.data, Room::Owned(owned)) {
            Room::Lent(posted) => Some(posted),
            Room::Owned(_) => unreachable!("checked above"),
        }
    }

    /// Ends the session: a partly assembled message and everything buffered
    /// ahead of a gap are dropped, never delivered. Messages already
    /// delivered but not yet taken stay counted until taken. Posted
    /// targets stay posted, in order.
    pub(super) fn reset(&mut self) {
        let mut posted = std::mem::take(&mut self.posted);
        if let Some(Assembly {
            data: Room::Lent(lent),
            ..
        }) = self.assembly.take()
        {
            posted.put_back(lent);
        }
        // A target staged for the old session's next message goes back in
        // line, to be spoiled if it names one.
        let staged = match self.staged.take() {
            Some(Room::Lent(lent)) => {
                posted.put_back(lent);
                None
            }
            owned => owned,
        };
        // No target naming a message takes one of the new session (their
        // ids start anew; a combining one may hold part of a message of the
        // old session, which will never be finished); their owner, who
        // learns of the restart, takes them back.
        posted.spoil_named();
        *self = Receiver {
            undelivered_packets: self.undelivered_packets,
            undelivered_bytes: self.undelivered_bytes,
            spares: std::mem::take(&mut self.spares),
            staged,
            posted,
            ..Receiver::default()
        };
    }

    /// The id of the message being assembled or, between messages, of the
    /// next one in order (`None` before the session's first).
    pub(super) fn next_in_order(&self) -> Option<u64> {
        match &self.assembly {
            Some(assembly) if assembly.discard => Some(assembly.msg_id.wrapping_add(1)),
            Some(assembly) => Some(assembly.msg_id),
            None => self.expected_msg_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Spares;

    fn spares(capacities: &[usize]) -> Spares {
        let mut spares = Spares::default();
        for &capacity in capacities {
            spares.keep(Vec::with_capacity(capacity), usize::MAX, usize::MAX);
        }
        spares
    }

    /// The capacities kept, oldest first, after checking the running total.
    fn capacities(spares: &Spares) -> Vec<usize> {
        let capacities: Vec<usize> = spares.buffers.iter().map(Vec::capacity).collect();
        assert_eq!(
            spares.bytes,
            capacities.iter().sum::<usize>(),
            "running total"
        );
        capacities
    }

    #[test]
    fn a_large_buffer_given_back_displaces_the_oldest_spares() {
        let mut kept = spares(&[100, 100, 100, 100]);
        kept.keep(Vec::with_capacity(4 << 20), 1 << 20, 8);
        assert_eq!(capacities(&kept), [4 << 20], "larger than the limit alone");
        let mut kept = spares(&[300, 200, 100]);
        kept.keep(Vec::with_capacity(500), 700, 8);
        assert_eq!(capacities(&kept), [100, 500], "the oldest went first");
        let mut kept = spares(&[1, 2, 3]);
        kept.keep(Vec::with_capacity(4), 1 << 20, 3);
        assert_eq!(capacities(&kept), [2, 3, 4], "the count limit too");
        let mut kept = spares(&[1, 2]);
        kept.keep(Vec::with_capacity(3), 1 << 20, 8);
        assert_eq!(capacities(&kept), [1, 2, 3], "within limits all stay");
    }

    #[test]
    fn a_message_takes_the_newest_spare_that_fits_else_the_largest() {
        let mut kept = spares(&[64, 4096, 1 << 20, 256]);
        assert_eq!(kept.take(200).capacity(), 256, "the newest fits");
        assert_eq!(
            kept.take(1 << 19).capacity(),
            1 << 20,
            "the newest is too small: the largest"
        );
        assert_eq!(capacities(&kept), [64, 4096]);
        assert_eq!(kept.take(1 << 30).capacity(), 4096);
        assert_eq!(kept.take(0).capacity(), 64);
        assert_eq!(kept.take(0).capacity(), 0, "none left: a new one");
        assert_eq!(capacities(&kept), Vec::<usize>::new());
    }
}
