//! The primitive `barlink.torch` builds torch.distributed's collectives
//! from: send a buffer to one peer while receiving a buffer of known size
//! from another (MPI's sendrecv), in chunks, combining what arrives into
//! the receive buffer where asked, with the GIL released throughout.
//!
//! Chunks pipeline the work: while this side combines one chunk, the peer
//! is already writing the next into the ring. The sent buffer is read in
//! place and the call returns only once the peer acknowledged all of it,
//! so the caller may then overwrite it. Every length a peer sent is checked
//! against the one this side expects before a byte of it is used.
#![forbid(unsafe_code)]

mod fill;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use barlink::Connection;
use barlink_transport::link::IoError;
use barlink_transport::{Delivery, LinkError, MessageId, PostId, RecvTarget};

use crate::buffer::{BufferView, LandingView, overlap};
use crate::errors::Raisable;
use crate::link::{Deadline, Failure, HeldView, Link, Payload, Shared};
use crate::reduce::{self, Dtype, Op};
use crate::targets::{CombiningRange, LEAST_LENT, MOST_LENT, MOST_LENT_BYTES, Scratch};
use fill::{Fill, filling};

/// Longest peer-written text an error repeats.
const SHOWN: usize = 160;

fn shown(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN)]).into_owned();
    if bytes.len() > SHOWN {
        format!("{text}...")
    } else {
        text
    }
}

/// The sending half: the tag, then the buffer in chunks, each a message.
#[derive(Debug)]
struct Sending {
    shared: Arc<Shared>,
    held: Arc<HeldView>,
    len: usize,
    chunk: usize,
    tag: Option<Vec<u8>>,
    /// Offset of the next chunk to queue.
    next: usize,
    /// Index of the last message queued.
    last: Option<u64>,
    /// Where the bytes come from, if they are not in the buffer yet.
    fill: Option<Fill>,
}

impl Sending {
    /// Queues what there is room for, up to byte `limit` (`len`, unless
    /// the bytes are still arriving from a receiving half: a chain's
    /// step), and drives the link once: whether all of it is
    /// acknowledged, and whether anything moved.
    fn step(&mut self, limit: usize) -> Result<(bool, bool), Failure> {
        let mut state = self.shared.lock();
        let mut moved = false;
        if let Some(tag) = &self.tag {
            match state.queue(Payload::Copied(tag.clone()), Duration::ZERO)? {
                Ok(index) => {
                    self.last = Some(index);
                    self.tag = None;
                    moved = true;
                }
                Err(_) => return Ok((false, state.conn()?.progress()?)),
            }
        }
        while self.next < self.len {
            let end = (self.next + self.chunk).min(self.len);
            if end > limit {
                break;
            }
            if let Some(fill) = &mut self.fill {
                if state.conn()?.has_unsent() {
                    break;
                }
                fill.copy(self.next..end);
            }
            let payload = Payload::HeldRange(self.held.clone(), self.next..end);
            match state.queue(payload, Duration::ZERO)? {
                Ok(index) => {
                    self.last = Some(index);
                    self.next = end;
                    moved = true;
                }
                Err(_) => break,
            }
        }
        let conn = state.conn()?;
        moved |= conn.progress()?;
        let acknowledged = self.last.is_none_or(|last| conn.completed() > last);
        if !acknowledged {
            conn.check_open()?;
        }
        Ok((self.queued() && acknowledged, moved))
    }

    /// Whether every message is queued.
    fn queued(&self) -> bool {
        self.tag.is_none() && self.next >= self.len
    }
}

/// Receiving halves after the first that lend targets behind it, at most.
const LENDING_HALVES: usize = 8;

/// Targets lent to the link ahead of their chunks' arrival: every chunk
/// the peer may have in flight (its credit, `recv_window_bytes`) twice
/// over, as the peer sends the next step's chunks on while this side still
/// receives the current step's, and two more, so that none arrives before
/// its target and is copied once more. At least `LEAST_LENT`; at most
/// `MOST_LENT`, and at most `MOST_LENT_BYTES` of chunks (each a scratch
/// buffer of its own where chunks are combined).
fn lent_ahead(conn: &Connection<Payload>, chunk: usize) -> usize {
    let chunk = chunk.max(1);
    let wanted = conn
        .recv_window_bytes()
        .div_ceil(chunk)
        .saturating_mul(2)
        .saturating_add(2);
    wanted
        .min(MOST_LENT_BYTES / chunk)
        .clamp(LEAST_LENT, MOST_LENT)
}

/// The receiving half: the tag the peer must send first, then chunks
/// landed, copied or combined into the buffer.
///
/// Targets are lent to the link before their chunks arrive: the buffer's
/// own ranges where chunks are copied, so they land in place with no copy
/// after the checked one out of the medium; scratch buffers where they are
/// combined; the tag's own, first. In a chain, a half whose every chunk
/// has a target lets the next half lend too, so the next step's chunks
/// land in place as well. A message that arrives anywhere else (it began
/// before its target was posted) is copied, after every target of this
/// half and of the halves after it is taken back, and lending starts
/// again after it.
///
/// A combining half lends its buffer's ranges as combining targets, each
/// naming the message it is for, once the link knows the ids of the
/// messages to come (`Connection::next_message_id`); until then it lends
/// scratch buffers. A named target is never out of step, so it is not
/// taken back when another message arrives elsewhere (it may be
/// combining its message already): only the one its message passed by.
#[derive(Debug)]
struct Receiving {
    shared: Arc<Shared>,
    view: LandingView,
    chunk: usize,
    tag: Option<Vec<u8>>,
    /// The tag's own target, while lent.
    tag_post: Option<PostId>,
    /// Scratch targets lent, in the order posted.
    scratch: VecDeque<PostId>,
    /// For a combining half: whether it lends combining targets (named
    /// messages) rather than scratch buffers, once decided by its first
    /// lend; and the message each lent one names, in the order lent.
    named: Option<bool>,
    naming: VecDeque<u64>,
    /// Bytes its combining targets combined, and of those the bytes of
    /// chunks taken: a target taken back with more in it (the exchange
    /// was interrupted while a chunk arrived) leaves part of a chunk
    /// combined, and the half `broken`.
    folded: Arc<AtomicUsize>,
    folded_taken: usize,
    broken: bool,
    /// The peer's session when the exchange was made (or, if the link
    /// had not heard from the peer yet, when this half first lent): a
    /// restart of the peer loses what its last session sent, and may
    /// leave part of a message folded into a combining target.
    peer_epoch: Option<u32>,
    /// Bytes of the buffer written so far.
    done: usize,
    /// Bytes of the buffer lent so far (`done` and beyond).
    lent_to: usize,
    reduce: Option<(Dtype, Op)>,
    /// For a combining half: where the buffer's starting values are read
    /// from, if not from the buffer (each chunk is copied from there as
    /// it is combined, so the buffer is written once).
    base: Option<Arc<HeldView>>,
}

/// Where a delivered message is, for the receiving half.
enum Arrived {
    /// In the range of the buffer it was lent for.
    InPlace(std::ops::Range<usize>),
    /// In a scratch target, this long.
    Scratch(Box<dyn RecvTarget>, usize),
    /// In the tag's own target, this long.
    Tag(Vec<u8>),
    /// Anywhere else: its bytes.
    Elsewhere(Vec<u8>),
}

impl Receiving {
    /// Targets lent and not yet handed back.
    fn lent(&self) -> usize {
        usize::from(self.tag_post.is_some()) + self.view.lent() + self.scratch.len()
    }

    /// Whether every message still to come has its target lent.
    fn fully_lent(&self) -> bool {
        (self.tag.is_none() || self.tag_post.is_some()) && self.lent_to >= self.view.len()
    }

    /// Messages of this half the caller has not taken yet: its tag and
    /// its chunks.
    fn messages_left(&self) -> u64 {
        let chunks = (self.view.len() - self.done.min(self.view.len())).div_ceil(self.chunk.max(1));
        u64::from(self.tag.is_some()) + chunks as u64
    }

    /// Whether this half's lent chunk targets name their messages.
    fn names_messages(&self) -> bool {
        self.named == Some(true)
    }

    /// Lends the tag's target and the coming chunks' targets until `room`
    /// targets of this half are lent. `first_id`: the id of this half's
    /// first message not taken yet, where the link knows it.
    fn lend_ahead(&mut self, conn: &mut Connection<Payload>, room: usize, first_id: Option<u64>) {
        // The session its targets were lent in, which `same_peer` holds
        // the link to.
        if let Some(epoch) = conn.peer_epoch() {
            self.peer_epoch.get_or_insert(epoch);
        }
        if let Some(tag) = &self.tag
            && self.tag_post.is_none()
            && self.lent() == 0
            && room > 0
        {
            self.tag_post = Some(conn.post_recv(Box::new(vec![0u8; tag.len()])));
        }
        let len = self.view.len();
        self.lent_to = self.lent_to.max(self.done);
        while self.lent() < room && self.lent_to < len {
            let end = (self.lent_to + self.chunk).min(len);
            if let Some((dtype, op)) = self.reduce {
                let ahead = u64::from(self.tag.is_some())
                    + ((self.lent_to - self.done) / self.chunk) as u64;
                let id = first_id.map(|first| first.wrapping_add(ahead));
                match (*self.named.get_or_insert(id.is_some()), id) {
                    (true, Some(id)) => {
                        let base = self.base.as_ref().map(|b| (Arc::clone(b), self.lent_to));
                        self.view.lend_as(conn, self.lent_to..end, |range| {
                            Box::new(CombiningRange {
                                range,
                                id: MessageId(id),
                                dtype,
                                op,
                                carry: [0; 8],
                                carried: 0,
                                folded: Arc::clone(&self.folded),
                                base,
                            })
                        });
                        self.naming.push_back(id);
                    }
                    // The ids are not known again until the link's next
                    // session delivers a message (after a peer restart).
                    (true, None) => break,
                    (false, _) => self
                        .scratch
                        .push_back(conn.post_recv(Box::new(Scratch::take(self.chunk)))),
                }
            } else {
                self.view.lend(conn, self.lent_to..end);
            }
            self.lent_to = end;
        }
    }

    /// Lends targets for this half and, once all of its are lent, for the
    /// halves after it, in order: [`lent_ahead`] in all.
    fn lend_in_order(
        &mut self,
        conn: &mut Connection<Payload>,
        later: &mut [Receiving],
        parked: bool,
    ) {
        let most = lent_ahead(conn, self.chunk);
        let next_id = conn.next_message_id().filter(|_| !parked);
        let mut lent = 0;
        let mut before = 0u64;
        for half in std::iter::once(self).chain(later.iter_mut()) {
            let room = most.saturating_sub(lent);
            half.lend_ahead(conn, room, next_id.map(|id| id.0.wrapping_add(before)));
            before += half.messages_left();
            lent += half.lent();
            if !half.fully_lent() {
                break;
            }
        }
    }

    /// Takes back every target lent but, with `keep_named`, those that
    /// name their messages (which cannot be out of step, and may be
    /// combining one); lending starts again from `done` (or goes on from
    /// the named ones).
    fn take_back(&mut self, mut conn: Option<&mut Connection<Payload>>, keep_named: bool) {
        for id in self
            .tag_post
            .take()
            .into_iter()
            .chain(self.scratch.drain(..))
        {
            if let Some(conn) = conn.as_deref_mut() {
                let _ = conn.unpost_recv(id);
            }
        }
        if keep_named && self.names_messages() {
            return;
        }
        self.view.take_back_all(conn);
        self.naming.clear();
        self.lent_to = self.done;
        // Under the link's lock: no target combines meanwhile.
        self.broken |= self.folded.load(Ordering::Relaxed) != self.folded_taken;
    }

    /// Takes back every target, under its link's lock.
    fn take_back_locked(&mut self) {
        let shared = Arc::clone(&self.shared);
        let mut state = shared.lock();
        self.take_back(state.conn.as_mut(), false);
    }

    /// Takes back every target of this half and of the halves after it,
    /// which were lent behind this half's.
    fn take_back_in_order(
        &mut self,
        mut conn: Option<&mut Connection<Payload>>,
        later: &mut [Receiving],
    ) {
        self.take_back(conn.as_deref_mut(), true);
        for half in later {
            half.take_back(conn.as_deref_mut(), true);
        }
    }

    /// Where `delivery` is; anything but the target lent first means the
    /// lent targets are out of step with the messages: all are taken back
    /// (but targets naming their messages, which are never out of step).
    /// A combining target, or a message that is not the one the first
    /// lent one names, out of step: the peer's messages are not this
    /// exchange's.
    fn arrived(
        &mut self,
        delivery: Delivery,
        conn: &mut Connection<Payload>,
        later: &mut [Receiving],
    ) -> Result<Arrived, Failure> {
        let out_of_step = |id: MessageId, expected: Option<&u64>| {
            Failure::Mismatch(format!(
                "message {} took a combining target where this exchange expected {}: the \
                 peer's messages are not this exchange's (another exchange's, or a peer that \
                 restarted)",
                id.0,
                expected.map_or_else(|| "another".to_string(), |e| format!("message {e}")),
            ))
        };
        match delivery {
            Delivery::Landed { recv, len, id } => {
                let post = recv.id();
                if self.tag_post == Some(post) {
                    self.tag_post = None;
                    let mut target = recv.into_target();
                    return Ok(Arrived::Tag(target.bytes_mut()[..len].to_vec()));
                }
                if self.tag_post.is_none() {
                    if let Some(range) = self.view.landed(post) {
                        if self.naming.pop_front().is_some() {
                            self.folded_taken += len;
                        }
                        return Ok(Arrived::InPlace(range.start..range.start + len));
                    }
                    if self.scratch.front() == Some(&post) {
                        self.scratch.pop_front();
                        return Ok(Arrived::Scratch(recv.into_target(), len));
                    }
                }
                if recv.is_combining() {
                    return Err(out_of_step(id, self.naming.front()));
                }
                // Never expected (targets go in the order posted); read it
                // into memory of its own before the view is written.
                let bytes = recv.into_target().bytes_mut()[..len].to_vec();
                self.passed_by(id, conn, later)?;
                Ok(Arrived::Elsewhere(bytes))
            }
            Delivery::Message { data, id } => {
                self.passed_by(id, conn, later)?;
                Ok(Arrived::Elsewhere(data))
            }
        }
    }

    /// Message `id` arrived elsewhere than in a target of this half: in a
    /// half whose targets name their messages, only the one it passed by
    /// is taken back (and it must be that one's message); else every
    /// target of this half and of the halves after it.
    fn passed_by(
        &mut self,
        id: MessageId,
        conn: &mut Connection<Payload>,
        later: &mut [Receiving],
    ) -> Result<(), Failure> {
        if self.tag.is_none()
            && let Some(&named) = self.naming.front()
        {
            if id.0 != named {
                return Err(Failure::Mismatch(format!(
                    "message {} arrived where this exchange expected message {named}: the \
                     peer's messages are not this exchange's (another exchange's, or a peer \
                     that restarted)",
                    id.0
                )));
            }
            self.view.take_back_first(conn);
            self.naming.pop_front();
            return Ok(());
        }
        self.take_back_in_order(Some(conn), later);
        Ok(())
    }

    /// Takes every message that arrived: whether the buffer is complete,
    /// and whether anything moved. `later` are the halves after this one
    /// that may lend targets behind it.
    fn step(&mut self, later: &mut [Receiving]) -> Result<(bool, bool), Failure> {
        let shared = Arc::clone(&self.shared);
        let mut state = shared.lock();
        shared.spares.give_back(&mut state.conn);
        let mut moved = false;
        let len = self.view.len();
        loop {
            self.same_peer(state.conn.as_ref())?;
            let complete = self.tag.is_none() && self.done >= len;
            let delivery = if complete {
                None
            } else {
                // A message `recv_into` parked is not counted by the link:
                // no message ids are named while one waits.
                let parked = state.has_pending();
                if let Some(conn) = state.conn.as_mut() {
                    self.lend_in_order(conn, later, parked);
                }
                Shared::next_delivery(&mut state)?
            };
            let Some(delivery) = delivery else {
                if moved {
                    // The engine holds its acknowledgement while a message
                    // waits for the caller; now that they are taken, let it
                    // go, or the sender waits for it until this side next
                    // drives the link.
                    state.conn()?.progress()?;
                }
                return Ok((complete, moved));
            };
            moved = true;
            // Driving the link may have brought a restart of the peer.
            self.same_peer(state.conn.as_ref())?;
            let arrived = self.arrived(delivery, state.conn()?, later)?;
            if let Some(want) = self.tag.take() {
                let message = match arrived {
                    Arrived::Tag(bytes) | Arrived::Elsewhere(bytes) => bytes,
                    Arrived::InPlace(range) => {
                        // A chunk's target took it: the tag's did not come
                        // first, so the peer sent no tag of this length.
                        self.take_back_in_order(state.conn.as_mut(), later);
                        self.view.range_mut(range).to_vec()
                    }
                    Arrived::Scratch(mut target, len) => {
                        self.take_back_in_order(state.conn.as_mut(), later);
                        target.bytes_mut()[..len].to_vec()
                    }
                };
                if message != want {
                    return Err(Failure::Mismatch(format!(
                        "the peer sent \"{}\" where this rank expected \"{}\"",
                        shown(&message),
                        shown(&want)
                    )));
                }
                self.shared.spares.keep(message);
                continue;
            }
            let want = (len - self.done).min(self.chunk);
            let got = match &arrived {
                Arrived::InPlace(range) => range.len(),
                Arrived::Scratch(_, len) => *len,
                Arrived::Tag(bytes) | Arrived::Elsewhere(bytes) => bytes.len(),
            };
            if got != want {
                return Err(Failure::Mismatch(format!(
                    "the peer sent a chunk of {got} bytes where this rank expected {want} (at byte \
                     {} of {len}): the ranks' tensors differ in size",
                    self.done
                )));
            }
            let range = self.done..self.done + want;
            match arrived {
                Arrived::InPlace(landed) => debug_assert_eq!(landed, range),
                Arrived::Scratch(mut target, len) => {
                    self.land(range, &target.bytes_mut()[..len])?;
                }
                Arrived::Tag(message) | Arrived::Elsewhere(message) => {
                    self.land(range, &message)?;
                    self.shared.spares.keep(message);
                }
            }
            self.done += want;
        }
    }

    /// Fails once the peer's session is another than the exchange began
    /// in (`peer_epoch`): what its last session sent is lost, and part of
    /// a message may be folded into a combining target already.
    fn same_peer(&mut self, conn: Option<&Connection<Payload>>) -> Result<(), Failure> {
        let Some(epoch) = conn.and_then(Connection::peer_epoch) else {
            return Ok(());
        };
        match self.peer_epoch.replace(epoch) {
            Some(old_epoch) if old_epoch != epoch => {
                Err(Failure::Io(IoError::Closed(LinkError::PeerRestarted {
                    old_epoch,
                    new_epoch: epoch,
                })))
            }
            _ => Ok(()),
        }
    }

    /// Copies or combines a chunk into `range` of the buffer.
    fn land(&mut self, range: std::ops::Range<usize>, chunk: &[u8]) -> Result<(), Failure> {
        let target = self.view.range_mut(range.clone());
        if let Some(base) = &self.base {
            target.copy_from_slice(base.range(range));
        }
        match self.reduce {
            None => target.copy_from_slice(chunk),
            Some((dtype, op)) => reduce::combine(target, chunk, dtype, op)
                .map_err(|e| Failure::Mismatch(e.to_string()))?,
        }
        Ok(())
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        // The tag's and the scratch targets are buffers of their own; the
        // view takes its lent ranges back itself. Taking these back too
        // keeps the link's next receive from landing in them.
        if self.tag_post.is_some() || !self.scratch.is_empty() {
            self.take_back_locked();
        }
    }
}

fn both<A, B>(name: &str, a: Option<A>, b: Option<B>) -> PyResult<Option<(A, B)>> {
    match (a, b) {
        (Some(a), Some(b)) => Ok(Some((a, b))),
        (None, None) => Ok(None),
        _ => Err(PyValueError::new_err(format!(
            "{name}: give both the link and the buffer, or neither"
        ))),
    }
}

/// Sends and receives in progress (see `Exchange.__new__` and
/// `Exchange.chain`): sending halves over one link, one after another,
/// and receiving halves over another (or the same), one after another.
#[derive(Debug)]
struct Halves {
    /// Sending halves not yet done, in order; only the front one queues.
    /// Each but the last leaves once all of it is queued.
    sends: VecDeque<Sending>,
    /// Receiving halves not yet complete, in order; only the front one
    /// takes messages.
    recvs: VecDeque<Receiving>,
    /// Sending halves that left `sends`.
    sent_steps: usize,
    /// Receiving halves that left `recvs`.
    received_steps: usize,
    /// Where the sending halves that left `sends` read, and the index of
    /// their last message: a receiving half over the same memory waits
    /// for the peer's acknowledgement of it (see `cleared`).
    sent: Vec<(std::ops::Range<usize>, Option<u64>)>,
    /// The link the sending halves use.
    send_link: Option<Arc<Shared>>,
    /// The links' state, to release the views they buried.
    links: Vec<Arc<Shared>>,
    /// Receiving halves that completed, kept for [`Exchange::run`] to
    /// drop once it no longer holds the exchange's lock: dropping one
    /// releases `recv_buf`, which can run Python code.
    received: Vec<Receiving>,
}

/// What a round of [`Exchange::run`] let go of: dropped, with the GIL,
/// once the exchange's lock is free.
struct Released {
    _views: Vec<BufferView>,
    _halves: Vec<Receiving>,
}

impl Halves {
    /// Each sending half after the first sends the buffer the receiving
    /// half before it receives, each chunk once it arrived (a chain).
    fn new(sends: Vec<Sending>, recvs: Vec<Receiving>) -> Halves {
        let mut links: Vec<Arc<Shared>> = Vec::new();
        let shared = sends.iter().map(|s| &s.shared);
        for link in shared.chain(recvs.iter().map(|r| &r.shared)) {
            if !links.iter().any(|known| Arc::ptr_eq(known, link)) {
                links.push(Arc::clone(link));
            }
        }
        Halves {
            send_link: sends.first().map(|s| Arc::clone(&s.shared)),
            sends: sends.into(),
            recvs: recvs.into(),
            sent_steps: 0,
            received_steps: 0,
            sent: Vec::new(),
            links,
            received: Vec::new(),
        }
    }

    /// Whether receiving half `index` of `recvs` may have its memory
    /// written: not while an earlier sending half over the same memory may
    /// still read it again for a retransmission, on another link that
    /// another thread may drive meanwhile. In a ring the peer's bytes for
    /// it come only after the peer received those, so this waits for no
    /// more than the acknowledgement. Over one link, retransmissions and
    /// landings take turns under its lock, and a retransmission of a chunk
    /// the peer already has is discarded there whatever it holds. This is
    /// what keeps `LandingView::lend`'s promise that nothing else writes a
    /// lent range.
    fn cleared(&mut self, index: usize) -> Result<bool, Failure> {
        let send_link = self.send_link.clone();
        let half = &self.recvs[index];
        let span = half.view.span();
        let overlaps = |read: &std::ops::Range<usize>| overlap(read, &span);
        // Nor while an earlier receiving half, not complete yet, may still
        // write the same memory: its lent ranges or combines come first.
        if self
            .recvs
            .iter()
            .take(index)
            .any(|earlier| overlaps(&earlier.view.span()))
        {
            return Ok(false);
        }
        let Some(send_link) = send_link else {
            return Ok(true);
        };
        if Arc::ptr_eq(&send_link, &half.shared) {
            return Ok(true);
        }
        // Sending halves still in `sends` that come before this receiving
        // half; the one of the same step was refused overlap when built.
        let step = self.received_steps + index;
        let waiting = self.sends.iter().take(step.saturating_sub(self.sent_steps));
        for sending in waiting {
            if overlaps(&sending.held.span()) {
                return Ok(false);
            }
        }
        let mut entry = 0;
        while entry < self.sent.len() {
            let (read, last) = &self.sent[entry];
            if !overlaps(read) {
                entry += 1;
                continue;
            }
            let acknowledged = match last {
                None => true,
                Some(last) => send_link.lock().conn()?.completed() > *last,
            };
            if !acknowledged {
                return Ok(false);
            }
            self.sent.swap_remove(entry);
        }
        Ok(true)
    }

    /// Steps the halves once each: whether all are done, and whether
    /// anything moved.
    fn step(&mut self) -> Result<(bool, bool), Failure> {
        let mut moved = false;
        // Any half, not only the front one: the others go on sending
        // around the ring meanwhile.
        if self.recvs.iter().any(|half| half.broken) {
            return Err(Failure::Interrupted(
                "this exchange was interrupted (a timeout or a signal) while a chunk was being \
                 combined into recv_buf: it cannot be resumed; recv_buf's contents are \
                 unspecified, and the link's next messages may be this exchange's",
            ));
        }
        // Receiving first: it lends the buffer to the link before the
        // sending half's progress can bring the first chunks in.
        while !self.recvs.is_empty() && self.cleared(0)? {
            // The halves after the front that may lend targets behind it:
            // no more than LENDING_HALVES, so a poll's checks do not grow with
            // the number of steps.
            let mut lendable = 0;
            while lendable < LENDING_HALVES
                && lendable + 1 < self.recvs.len()
                && self.cleared(lendable + 1)?
            {
                lendable += 1;
            }
            let halves = self.recvs.make_contiguous();
            let (receiving, later) = halves.split_first_mut().expect("checked not empty");
            let (complete, receive_moved) = receiving.step(&mut later[..lendable])?;
            moved |= receive_moved;
            if !complete {
                break;
            }
            let complete = self.recvs.pop_front().expect("checked not empty");
            self.received.push(complete);
            self.received_steps += 1;
        }
        while !self.sends.is_empty() {
            let more = self.sends.len() > 1;
            let sending = self.sends.front_mut().expect("checked not empty");
            // The bytes the receiving half before this one has taken.
            let limit = match self.sent_steps.checked_sub(1) {
                None => sending.len,
                Some(source) => match source.cmp(&self.received_steps) {
                    std::cmp::Ordering::Less => sending.len,
                    std::cmp::Ordering::Equal => self.recvs.front().map_or(0, |r| r.done),
                    std::cmp::Ordering::Greater => 0,
                },
            };
            let (done, send_moved) = sending.step(limit)?;
            moved |= send_moved;
            let leaves = done || (more && sending.queued());
            if !leaves {
                break;
            }
            let sending = self.sends.pop_front().expect("checked not empty");
            self.sent_steps += 1;
            if !done {
                self.sent.push((sending.held.span(), sending.last));
            }
            if let Some(next) = self.sends.front_mut() {
                // The last half's acknowledgement covers the earlier ones'.
                next.last = next.last.max(sending.last);
            }
        }
        Ok((self.sends.is_empty() && self.recvs.is_empty(), moved))
    }

    /// Steps both halves until both are done (true) or `slice` passed.
    fn drive(&mut self, slice: Duration) -> Result<bool, Failure> {
        let started = Instant::now();
        loop {
            let (done, moved) = self.step()?;
            if done {
                return Ok(true);
            }
            if started.elapsed() >= slice {
                return Ok(false);
            }
            if !moved {
                std::thread::yield_now();
            }
        }
    }

    /// The views the links let go of meanwhile and the receiving halves
    /// that completed, for the caller to drop with the GIL once it no
    /// longer holds the exchange's lock.
    fn take_released(&mut self) -> Released {
        Released {
            _views: self
                .links
                .iter()
                .flat_map(|shared| shared.graveyard.take())
                .collect(),
            _halves: std::mem::take(&mut self.received),
        }
    }
}

#[derive(Debug)]
enum Progress {
    Running(Box<Halves>),
    Done,
    /// Failed: every call raises this anew. Kept as a type and a text, not
    /// a Python exception: making that runs Python code (a finalizer may
    /// run and ask this exchange `done`), which must not happen under the
    /// lock.
    Failed(Raisable),
}

/// Sends `send_buf` over `send_to` while receiving exactly `len(recv_buf)`
/// bytes over `recv_from` into `recv_buf`, both in messages of `chunk`
/// bytes (the last shorter); with `reduce=(op, dtype)` each received chunk
/// is combined into `recv_buf` (`recv_buf = recv_buf op chunk`) instead of
/// copied. With `tag`, the first message each way is `tag`, and a peer
/// that sent anything else raises Mismatch: the ranks called different
/// operations. Either half may be left out; the buffers must not overlap.
///
/// Nothing moves until `test` or `wait` is called; `wait` returns once
/// all is received and the peer acknowledged all that was sent, so the
/// caller may then overwrite `send_buf`. A failure is raised again by
/// every later call.
#[pyclass(module = "barlink", frozen)]
#[derive(Debug)]
pub struct Exchange {
    progress: Mutex<Progress>,
}

impl Exchange {
    /// Takes back every receive target a running exchange lent.
    fn take_back(&self, py: Python<'_>) {
        if let Progress::Running(halves) = &mut *self.lock_with(py) {
            for receiving in &mut halves.recvs {
                receiving.take_back_locked();
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock, taken by a caller that holds the GIL: waited for without
    /// it. The thread driving the exchange holds the lock while it runs
    /// without the GIL, and needs the GIL back before it lets the lock go;
    /// a caller blocked on the lock with the GIL (`done` polled from
    /// another thread) would wait for it forever.
    fn lock_with(&self, py: Python<'_>) -> MutexGuard<'_, Progress> {
        loop {
            match self.progress.try_lock() {
                Ok(guard) => return guard,
                Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => crate::exit::detached(py, || drop(self.lock())),
            }
        }
    }

    /// Drives the exchange for at most `slice` without the GIL: whether it
    /// is done.
    fn run(&self, py: Python<'_>, slice: Duration) -> PyResult<bool> {
        let mut progress = self.lock_with(py);
        let (outcome, released) = match &mut *progress {
            Progress::Done => return Ok(true),
            Progress::Failed(failure) => {
                let failure = failure.clone();
                drop(progress);
                return Err(failure.raise());
            }
            Progress::Running(halves) => {
                // Parked at the interpreter's exit, a thread keeps the
                // exchange's lock: only a call on this exchange made by
                // the exit itself would wait for it.
                let outcome = crate::exit::detached(py, || halves.drive(slice));
                (outcome, halves.take_released())
            }
        };
        let (result, finished) = match outcome {
            Ok(true) => (
                Ok(true),
                Some(std::mem::replace(&mut *progress, Progress::Done)),
            ),
            Ok(false) => (Ok(false), None),
            Err(failure) => {
                let failure = failure.into_raisable();
                let failed = Progress::Failed(failure.clone());
                (
                    Err(failure),
                    Some(std::mem::replace(&mut *progress, failed)),
                )
            }
        };
        // Buffers are released, with the GIL, only once the lock is free:
        // a release can run Python code (a finalizer of the buffer's
        // owner) that asks this exchange whether it is done. The sending
        // halves a failed exchange drops bury their buffers' views in
        // their links' graveyards: released too, so that the caller may
        // resize those buffers once this returns.
        let links = match &finished {
            Some(Progress::Running(halves)) => halves.links.clone(),
            _ => Vec::new(),
        };
        drop(progress);
        drop(released);
        drop(finished);
        for shared in &links {
            shared.graveyard.release(py);
        }
        result.map_err(|failure| failure.raise())
    }
}

#[pymethods]
impl Exchange {
    #[new]
    #[pyo3(signature = (
        send_to=None, send_buf=None, recv_from=None, recv_buf=None, *, chunk=1 << 20,
        reduce=None, tag=None,
    ))]
    fn new(
        send_to: Option<PyRef<'_, Link>>,
        send_buf: Option<&Bound<'_, PyAny>>,
        recv_from: Option<PyRef<'_, Link>>,
        recv_buf: Option<&Bound<'_, PyAny>>,
        chunk: usize,
        reduce: Option<(String, String)>,
        tag: Option<Vec<u8>>,
    ) -> PyResult<Exchange> {
        let reduce = parse_reduce(reduce, chunk)?;
        let sending = both("send", send_to, send_buf)?
            .map(|(link, buf)| sending_half(&link, buf, chunk, tag.clone()))
            .transpose()?;
        let mut receiving = both("recv", recv_from, recv_buf)?
            .map(|(link, buf)| receiving_half(&link, buf, chunk, tag.clone(), reduce))
            .transpose()?;
        if let Some(receiving) = &mut receiving
            && reduce.is_none()
        {
            // Copied, not combined: nothing reads recv_buf before the
            // exchange is done.
            receiving.view.filled_before_read();
        }
        if let (Some(s), Some(r)) = (&sending, &receiving) {
            refuse_overlap(s, r, "send_buf and recv_buf")?;
        }
        let halves = Halves::new(
            sending.into_iter().collect(),
            receiving.into_iter().collect(),
        );
        Ok(Exchange {
            progress: Mutex::new(Progress::Running(Box::new(halves))),
        })
    }

    /// Steps of a ring, as one exchange: each step sends its `send_buf`
    /// over `send_to` while receiving its `recv_buf` over `recv_from`, and
    /// every step after the first sends the buffer the step before it
    /// received, each chunk as soon as it arrived (and was combined, for
    /// a step whose third item is true; `reduce=(op, dtype)` says how).
    /// A buffer as the third item combines too, into `recv_buf` starting
    /// from that buffer's values instead of its own (`recv_buf = base op
    /// received`, each chunk copied from `base` as it is combined), so
    /// that no copy of `base` into `recv_buf` is made first; no step may
    /// receive into `base`.
    /// So the steps overlap: a chunk goes on around the ring while the
    /// rest of its step is still arriving. A step may receive into memory
    /// an earlier step sent or received: it waits until the earlier
    /// receive is complete and, where the earlier send went over another
    /// link, for that link's acknowledgement of it. With `tag`, the first
    /// message each way is `tag`. With `fill`, a buffer as long as the
    /// first step's `send_buf` and apart from every step's buffers, the
    /// first step's bytes come from `fill`: each chunk is copied into
    /// `send_buf` just before it goes (an all-gather's own part, copied
    /// while it is sent rather than before), and `send_buf` ends holding
    /// them all.
    #[staticmethod]
    #[pyo3(signature = (
        send_to, recv_from, steps, *, chunk=1 << 20, reduce=None, tag=None, fill=None,
    ))]
    fn chain(
        send_to: PyRef<'_, Link>,
        recv_from: PyRef<'_, Link>,
        steps: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>)>,
        chunk: usize,
        reduce: Option<(String, String)>,
        tag: Option<Vec<u8>>,
        fill: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Exchange> {
        let reduce = parse_reduce(reduce, chunk)?;
        let mut sends: Vec<Sending> = Vec::with_capacity(steps.len());
        let mut recvs: Vec<Receiving> = Vec::with_capacity(steps.len());
        for (index, (send_buf, recv_buf, combines)) in steps.iter().enumerate() {
            let first = index == 0;
            let step_tag = if first { tag.clone() } else { None };
            // True, false, or the buffer the combined values start from.
            let (combines, base) = match combines.extract::<bool>() {
                Ok(combines) => (combines, None),
                Err(_) => (true, Some(combines)),
            };
            let step_reduce = if combines {
                Some(reduce.ok_or_else(|| {
                    PyValueError::new_err(format!("step {index} combines, but no reduce was given"))
                })?)
            } else {
                None
            };
            let mut sending = sending_half(&send_to, send_buf, chunk, step_tag.clone())?;
            if first && let Some(fill) = &fill {
                sending.fill = Some(filling(fill, send_buf, &send_to)?);
            }
            let mut receiving = receiving_half(&recv_from, recv_buf, chunk, step_tag, step_reduce)?;
            if let Some(base) = base {
                receiving.base = Some(based_on(base, &receiving, &recv_from, index)?);
            }
            if index + 1 == steps.len() {
                // The last step's bytes are not sent on as they arrive.
                receiving.view.filled_before_read();
            }
            refuse_overlap(&sending, &receiving, &format!("step {index}'s buffers"))?;
            if let Some(before) = recvs.last()
                && before.view.span() != sending.held.span()
            {
                return Err(PyValueError::new_err(format!(
                    "step {index} must send the buffer step {} received",
                    index - 1
                )));
            }
            sends.push(sending);
            recvs.push(receiving);
        }
        // A base is read while the steps receive: no step may write it,
        // nor the fill that writes the first step's send_buf meanwhile.
        let filled = sends
            .first()
            .filter(|first| first.fill.is_some())
            .map(|first| first.held.span());
        for (index, half) in recvs.iter().enumerate() {
            if let Some(base) = &half.base
                && (recvs.iter().any(|r| overlap(&base.span(), &r.view.span()))
                    || filled.as_ref().is_some_and(|f| overlap(&base.span(), f)))
            {
                return Err(PyValueError::new_err(format!(
                    "step {index}'s starting values overlap a step's recv_buf (or the send_buf \
                     that fill writes): give them from memory nothing writes during the \
                     exchange, or combine in place with True"
                )));
            }
        }
        if let Some(first) = sends.first()
            && let Some(fill) = &first.fill
        {
            let apart = |span: std::ops::Range<usize>| !overlap(&fill.source_span(), &span);
            if !sends.iter().all(|s| apart(s.held.span()))
                || !recvs.iter().all(|r| apart(r.view.span()))
            {
                return Err(PyValueError::new_err(
                    "fill overlaps a step's buffers: give the bytes from memory of their own",
                ));
            }
            // A receive into the first buffer could land before the fill
            // reaches that range, and be overwritten by it.
            if recvs
                .iter()
                .any(|r| overlap(&first.held.span(), &r.view.span()))
            {
                return Err(PyValueError::new_err(
                    "with fill, no step may receive into the first step's send_buf",
                ));
            }
        }
        Ok(Exchange {
            progress: Mutex::new(Progress::Running(Box::new(Halves::new(sends, recvs)))),
        })
    }

    /// Moves what can move now, without waiting: whether it is done.
    fn test(&self, py: Python<'_>) -> PyResult<bool> {
        self.run(py, Duration::ZERO)
    }

    /// Waits at most `timeout` seconds (None: until done or the link
    /// fails) for it to be done.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let mut deadline = Deadline::new(timeout)?;
        loop {
            let slice = deadline.slice();
            if self.run(py, slice)? {
                return Ok(());
            }
            let interrupted = py.check_signals();
            if interrupted.is_err() || deadline.passed(slice) {
                // The exchange may be waited on again, and lends again from
                // where it stopped (unless a chunk was being combined in
                // place: that one fails when waited on again); until then
                // no receive of the link's lands in this one's memory.
                self.take_back(py);
                interrupted?;
                return Err(deadline.error("exchange"));
            }
        }
    }

    /// Whether it completed.
    #[getter]
    fn done(&self, py: Python<'_>) -> bool {
        matches!(*self.lock_with(py), Progress::Done)
    }
}

/// `(op, dtype)` as given to an exchange, checked against `chunk`.
fn parse_reduce(reduce: Option<(String, String)>, chunk: usize) -> PyResult<Option<(Dtype, Op)>> {
    let reduce = match reduce {
        None => None,
        Some((op, dtype)) => Some((parse_dtype(&dtype)?, parse_op(&op)?)),
    };
    if let Some((dtype, op)) = reduce {
        // Refused here, not by the first chunk: a chunk may be combined
        // inside the link, which must not fail.
        reduce::combine(&mut [], &[], dtype, op)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
    }
    let element = reduce.map_or(1, |(dtype, _)| dtype.size());
    if chunk == 0 || !chunk.is_multiple_of(element) {
        return Err(PyValueError::new_err(format!(
            "chunk must be a positive multiple of the element size {element}, not {chunk}"
        )));
    }
    Ok(reduce)
}

fn sending_half(
    link: &Link,
    buf: &Bound<'_, PyAny>,
    chunk: usize,
    tag: Option<Vec<u8>>,
) -> PyResult<Sending> {
    let view = BufferView::get(buf, false)?;
    let shared = link.shared().clone();
    Ok(Sending {
        len: view.len(),
        held: Arc::new(HeldView::new(view, shared.graveyard.clone())),
        shared,
        chunk,
        tag,
        next: 0,
        last: None,
        fill: None,
    })
}

/// The buffer a combining step's values start from: as long as its
/// `recv_buf`, and only read.
fn based_on(
    base: &Bound<'_, PyAny>,
    receiving: &Receiving,
    link: &Link,
    index: usize,
) -> PyResult<Arc<HeldView>> {
    let view = BufferView::get(base, false).map_err(|_| {
        PyTypeError::new_err(format!(
            "step {index}'s third item must be True, False, or a buffer its combined values \
             start from, not {}",
            base.get_type()
                .name()
                .map_or_else(|_| "this".into(), |name| name.to_string())
        ))
    })?;
    if view.len() != receiving.view.len() {
        return Err(PyValueError::new_err(format!(
            "step {index} combines into {} bytes starting from {}: give as many",
            receiving.view.len(),
            view.len()
        )));
    }
    Ok(Arc::new(HeldView::new(
        view,
        link.shared().graveyard.clone(),
    )))
}

fn receiving_half(
    link: &Link,
    buf: &Bound<'_, PyAny>,
    chunk: usize,
    tag: Option<Vec<u8>>,
    reduce: Option<(Dtype, Op)>,
) -> PyResult<Receiving> {
    let view = BufferView::get(buf, true)?;
    let element = reduce.map_or(1, |(dtype, _)| dtype.size());
    if !view.len().is_multiple_of(element) {
        return Err(PyValueError::new_err(format!(
            "recv_buf has {} bytes, not a whole number of {element}-byte elements",
            view.len()
        )));
    }
    let shared = link.shared().clone();
    // The session the exchange begins in, for every half alike: a half
    // that first looks after a restart of the peer must see it too.
    let peer_epoch = shared.lock().conn.as_ref().and_then(Connection::peer_epoch);
    Ok(Receiving {
        view: LandingView::new(view, shared.clone()),
        shared,
        chunk,
        tag,
        tag_post: None,
        scratch: VecDeque::new(),
        named: None,
        naming: VecDeque::new(),
        folded: Arc::new(AtomicUsize::new(0)),
        folded_taken: 0,
        broken: false,
        peer_epoch,
        done: 0,
        lent_to: 0,
        reduce,
        base: None,
    })
}

fn refuse_overlap(sending: &Sending, receiving: &Receiving, what: &str) -> PyResult<()> {
    if overlap(&sending.held.span(), &receiving.view.span()) {
        return Err(PyValueError::new_err(format!(
            "{what} overlap: the received bytes would change what is being sent"
        )));
    }
    Ok(())
}

fn parse_op(op: &str) -> PyResult<Op> {
    Op::parse(op).ok_or_else(|| {
        PyValueError::new_err(format!(
            "op {op:?} is not one of sum, product, min, max, band, bor, bxor"
        ))
    })
}

fn parse_dtype(dtype: &str) -> PyResult<Dtype> {
    Dtype::parse(dtype)
        .ok_or_else(|| PyValueError::new_err(format!("dtype {dtype:?} cannot be reduced")))
}

/// `dst = dst op src`, element by element, in place, without the GIL:
/// the reduction collectives use, for combining tensors of one rank.
#[pyfunction]
pub fn combine(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    op: &str,
    dtype: &str,
) -> PyResult<()> {
    let parsed_op = parse_op(op)?;
    let parsed_dtype = parse_dtype(dtype)?;
    let mut target = BufferView::get(dst, true)?;
    let source = BufferView::get(src, false)?;
    let (a, b) = (target.span(), source.span());
    if overlap(&a, &b) && a != b {
        return Err(PyValueError::new_err(
            "dst and src overlap without being the same memory",
        ));
    }
    if a == b && !a.is_empty() {
        // The same memory on both sides: combine with a copy of it.
        let copy = source.bytes().to_vec();
        return crate::exit::detached(py, || {
            reduce::combine(target.bytes_mut(), &copy, parsed_dtype, parsed_op)
        })
        .map_err(|e| PyValueError::new_err(e.to_string()));
    }
    crate::exit::detached(py, || {
        reduce::combine(target.bytes_mut(), source.bytes(), parsed_dtype, parsed_op)
    })
    .map_err(|e| PyValueError::new_err(e.to_string()))
}
