//! The state behind a link handle, and every operation on it, in safe Rust.
//!
//! A [`LinkCell`] is a mutex around a [`RingLink`] plus what the C API adds:
//! delivered messages not yet taken (so a buffer that is too small loses
//! nothing), the requests posted and their completions, and why the link
//! ended. Blocking calls lock the cell for one step of progress at a time,
//! so other threads can use the link between steps.
//!
//! Completions: the engine completes messages in order (cumulative
//! acknowledgement) and, when a session ends, fails every message still
//! queued. It lets go of a message's buffer exactly then, and the link
//! hands it back with the message's outcome (`Link::keep_sent_buffers`):
//! the request is marked with the outcome and the buffer's copy goes back
//! to the spares ([`SendCopies::give_back`]), with no count shared
//! between the two. The marked requests at the front of the queue, in
//! message order, become completions; once the link is gone (dropping it
//! dropped every payload it held), all of them, failed.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LockResult, Mutex, MutexGuard, TryLockError, Weak};
use std::time::{Duration, Instant};

use barlink::Connection;
use barlink::connect::AnyLink;
use barlink::rdma::SendMemory;
use barlink_transport::engine::{Delivery, LinkError, MessageId, PostId, SendError, Stats};
use barlink_transport::link::IoError;

use crate::completions::Completions;
use crate::config::SendLimits;
use crate::error::{Error, Result};
use crate::held::{HeldMessages, Lent};
use crate::payload::{CallerMemory, Payload, PayloadSource, SendCopies, SendLoan};
use crate::recv::{PostedRecvs, RECV_REQUEST};
use crate::types::barlink_status::{self, *};
use crate::types::{barlink_completion, barlink_stats};

mod direct;
mod guards;
mod registered;
mod requests;
mod rounds;

pub(crate) use guards::{LentForCall, SettleLoan};
use requests::Request;
pub(crate) use rounds::{Pace, Rounds};

/// Shortest message whose send copy is made outside the link's lock
/// ([`crate::payload::fill_copy`]), so that a progress thread, or a call
/// on another thread, moves the link while the bytes are copied; a
/// shorter copy takes less time than locking the link a second time.
pub(crate) const COPY_UNLOCKED_FROM: usize = 16 << 10;

/// Why a link ended, as the C API reports it.
fn end_of(error: &IoError) -> (barlink_status, String) {
    let status = match error {
        IoError::Closed(LinkError::LocalClose | LinkError::PeerClosed) => BARLINK_CLOSED,
        IoError::Closed(LinkError::PeerLost { .. }) => BARLINK_PEER_LOST,
        IoError::Timeout { .. } => BARLINK_TIMEOUT,
        IoError::TooLong { .. } => BARLINK_MESSAGE_TOO_LONG,
        _ => BARLINK_LINK_FAILED,
    };
    (status, error.to_string())
}

/// A link handle's object.
#[derive(Debug)]
pub(crate) struct LinkCell {
    state: Mutex<LinkState>,
    /// Calls waiting for the lock: a receive in place that keeps it
    /// across its idle rounds lets them in at its next round.
    lock_waiters: AtomicU32,
    /// Times a waiting receive let a waiting call in (tests read it).
    #[cfg(test)]
    pub(crate) gave_way: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
pub(crate) struct LinkState {
    /// `None` once the link ended: dropping it released every payload.
    link: Option<Connection<Payload>>,
    /// `barlink_close` ran: calls still inside return `BARLINK_CLOSED`.
    closed_by_handle: bool,
    /// Delivered messages not yet taken: in buffers of the link's, or in
    /// the buffer of a `barlink_recv` call still in progress.
    received: VecDeque<Delivery>,
    /// A blocking call is past its first round: its step may reuse the
    /// clock of the idle rounds before (see `Link::progress_waiting`).
    waiting: bool,
    /// The step is a receive's: a round that delivers a message returns
    /// it before sending or running timers, when nothing is due (the
    /// caller's answer usually carries the acknowledgement).
    for_delivery: bool,
    /// Messages the engine holds, by message id, oldest first (the
    /// engine numbers messages in the order they are queued, and completes
    /// them in that order).
    requests: VecDeque<(u64, Request)>,
    /// Posted receives not yet completed (`barlink_post_recv`).
    recvs: PostedRecvs,
    /// Messages received in place and not yet released.
    held: HeldMessages,
    /// Copies of finished copying sends, for the next ones.
    send_copies: SendCopies,
    /// Completions of posted sends not yet reported, by request id.
    done: Completions,
    /// Why the link ended.
    end: Option<(barlink_status, String)>,
    /// A message (sent or posted) failed: a flush cannot succeed any more.
    any_failed: bool,
    /// The engine's counters when the link ended.
    final_stats: Stats,
    /// `Connection::sent_in_place` as the link ended.
    final_in_place: (u64, u64),
    /// The path the link took and why (`barlink_link_path`).
    path: String,
    message_bytes_sent: u64,
    message_bytes_received: u64,
    limits: SendLimits,
    /// Bytes of memory (the copies' capacities) that requests of copying
    /// sends hold until the peer acknowledges them. New copies wait while
    /// it is past `limits.queue_bytes`; a call already past that check
    /// when another thread's copy went in may add one message more.
    copies_held: u64,
    /// Bytes of copies being made outside the lock, counted against
    /// `limits.queue_bytes` from the check that let them go until they are
    /// queued or given up ([`LinkState::reserve_copy`]).
    copies_reserved: u64,
    /// How the messages of blocking sends waiting on their lent bytes
    /// ended, by message id, until each call takes its own.
    loan_outcomes: BTreeMap<u64, barlink_status>,
    /// Messages of copying sends queued with a copy, and lent ones copied
    /// before their call returned (`barlink_stats`).
    messages_copied: u64,
    /// Lent messages the peer acknowledged while the link read them from
    /// the caller's memory, or all of them but the last packets, copied
    /// as the call returned (`barlink_stats`).
    messages_lent: u64,
    /// Lent messages whose call copied their last packets and returned.
    #[cfg(test)]
    pub(crate) tails_copied: u64,
    /// `barlink_recv` calls whose message landed in the caller's buffer
    /// as it arrived (`barlink_stats`; posted receives count their own).
    recvs_landed: u64,
}

/// The buffer of one `barlink_recv` call, and whether it is posted to
/// the link.
pub(crate) struct RecvInto {
    /// Not yet posted (`None` once posted, or when there is no room).
    target: Option<CallerMemory>,
    capacity: usize,
    pub(crate) posted: Option<PostId>,
}

impl RecvInto {
    /// `buf` is the caller's buffer of `capacity` bytes (checked by the
    /// extern function); an empty one is never posted.
    pub(crate) fn new(buf: *mut u8, capacity: usize) -> RecvInto {
        RecvInto {
            target: (capacity > 0).then(|| CallerMemory::new(buf, capacity)),
            capacity,
            posted: None,
        }
    }
}

/// Idle rounds of a blocking call between two yields of the CPU, as the
/// Rust link's waits.
const SPINS_BEFORE_YIELD: u32 = 1024;
/// Idle rounds between two reads of the clock in a blocking call.
const CLOCK_EVERY_IDLE_ROUNDS: u32 = 16;
/// A call counted among a lock's waiters until it has the lock (or
/// unwinds).
struct Waiting<'a>(&'a AtomicU32);

impl<'a> Waiting<'a> {
    fn counted(waiters: &'a AtomicU32) -> Waiting<'a> {
        waiters.fetch_add(1, Ordering::Relaxed);
        Waiting(waiters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a blocking loop does after one step.
pub(crate) enum Step<T> {
    Done(T),
    /// Not yet; `moved` says whether packets moved (spin) or not (yield).
    Again {
        moved: bool,
    },
}

/// Whether a blocking send on `link` returns with a copy of its lent
/// message's last packets once only they are unacknowledged: on links over
/// rings (host memory, BAR windows), whose packets are in the peer's ring
/// once sent and whose receiver acknowledges the packet before a tail at
/// once. Over TCP a packet sent may still wait in the link's own buffer for
/// the socket, and over RDMA the receiver acknowledges a batch at a time:
/// there the call waits for the whole message's acknowledgement.
fn copies_lent_tails<B: AsRef<[u8]>>(link: &AnyLink<B>) -> bool {
    matches!(link, AnyLink::HostBounce(_) | AnyLink::BarP2p(_))
}

impl LinkCell {
    /// Wraps a set-up link once it has heard its peer (so both sides know
    /// each other's epoch: a close right after setup reaches the peer),
    /// driving it until `deadline` at most.
    pub(crate) fn established(
        link: Connection<Payload>,
        limits: SendLimits,
        deadline: Instant,
    ) -> Result<LinkCell> {
        let cell = LinkCell::new(link, limits);
        {
            let mut state = cell.lock()?;
            loop {
                let moved = state.step();
                if let Some(error) = state.end_error() {
                    return Err(error);
                }
                if state.link.as_ref().is_some_and(Connection::is_connected) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(Error::new(
                        BARLINK_TIMEOUT,
                        "the peer set up its windows but did not answer over them in time",
                    ));
                }
                if !moved {
                    std::thread::yield_now();
                }
            }
        }
        Ok(cell)
    }

    fn new(mut link: Connection<Payload>, limits: SendLimits) -> LinkCell {
        let path = link.decision.to_string();
        // Each payload comes back with its outcome (see the module's
        // comment on completions).
        link.keep_sent_buffers();
        LinkCell {
            lock_waiters: AtomicU32::new(0),
            #[cfg(test)]
            gave_way: std::sync::atomic::AtomicU64::new(0),
            state: Mutex::new(LinkState {
                path,
                link: Some(link),
                closed_by_handle: false,
                received: VecDeque::new(),
                waiting: false,
                for_delivery: false,
                requests: VecDeque::new(),
                recvs: PostedRecvs::default(),
                held: HeldMessages::default(),
                send_copies: SendCopies::default(),
                done: Completions::default(),
                end: None,
                any_failed: false,
                final_stats: Stats::default(),
                final_in_place: (0, 0),
                message_bytes_sent: 0,
                message_bytes_received: 0,
                limits,
                copies_held: 0,
                copies_reserved: 0,
                loan_outcomes: BTreeMap::new(),
                messages_copied: 0,
                #[cfg(test)]
                tails_copied: 0,
                messages_lent: 0,
                recvs_landed: 0,
            }),
        }
    }

    /// Takes the mutex, counting the call among the lock's waiters while
    /// another holds it.
    fn acquire(&self) -> LockResult<MutexGuard<'_, LinkState>> {
        match self.state.try_lock() {
            Ok(state) => Ok(state),
            Err(TryLockError::Poisoned(poisoned)) => Err(poisoned),
            Err(TryLockError::WouldBlock) => {
                let _waiting = Waiting::counted(&self.lock_waiters);
                self.state.lock()
            }
        }
    }

    /// Locks the state for one step. A poisoned lock means a panic was
    /// caught in the middle of an operation on this link: it is not trusted
    /// again.
    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, LinkState>> {
        let state = self.acquire().map_err(|_| unusable())?;
        if state.closed_by_handle {
            return Err(closed_meanwhile());
        }
        Ok(state)
    }

    /// Locks the state to queue a copy of `reserved` bytes made outside
    /// the lock: gives its reservation back first, whatever happened
    /// meanwhile, then refuses as [`LinkCell::lock`] does.
    pub(crate) fn lock_after_copy(&self, reserved: usize) -> Result<MutexGuard<'_, LinkState>> {
        let (mut state, poisoned) = match self.acquire() {
            Ok(state) => (state, false),
            Err(poisoned) => (poisoned.into_inner(), true),
        };
        state.end_reservation(reserved);
        if poisoned {
            return Err(unusable());
        }
        if state.closed_by_handle {
            return Err(closed_meanwhile());
        }
        Ok(state)
    }

    /// Locks the state whatever happened to the link: for a call that must
    /// take its memory back from it before returning.
    pub(crate) fn lock_even_if_closed(&self) -> MutexGuard<'_, LinkState> {
        self.acquire().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `step` under the lock until it is done or `timeout` passed,
    /// unlocking between steps. Spins while packets move, yields when idle.
    pub(crate) fn blocking<T>(
        &self,
        timeout: Duration,
        mut step: impl FnMut(&mut LinkState) -> Result<Step<T>>,
    ) -> Result<T> {
        let mut rounds = Rounds::new(timeout);
        loop {
            let outcome = {
                let mut state = self.lock()?;
                // Rounds after the first of this call may reuse the clock
                // of the idle rounds before them; the first reads it.
                state.waiting = rounds.started();
                let outcome = step(&mut state);
                state.waiting = false;
                outcome?
            };
            match outcome {
                Step::Done(value) => return Ok(value),
                Step::Again { moved } => match rounds.after(moved)? {
                    Pace::Go => {}
                    Pace::Spin => std::hint::spin_loop(),
                    Pace::Yield => std::thread::yield_now(),
                },
            }
        }
    }

    /// Takes a `barlink_recv` call's buffer back (see
    /// [`LinkState::reclaim`]), also from a link that `barlink_close` is
    /// closing (it still drives the link) or that failed inside.
    pub(crate) fn reclaim(&self, id: PostId) {
        self.acquire()
            .unwrap_or_else(|p| p.into_inner())
            .reclaim(id);
    }

    /// Wraps the cell for the registry; with `progress_thread`, starts the
    /// thread that drives it (`BARLINK_CONFIG_PROGRESS_THREAD`).
    pub(crate) fn start(self, progress_thread: bool) -> Result<Arc<LinkCell>> {
        let cell = Arc::new(self);
        if progress_thread {
            let weak = Arc::downgrade(&cell);
            std::thread::Builder::new()
                .name("barlink-progress".into())
                .spawn(move || drive(&weak))
                .map_err(|error| {
                    Error::new(
                        BARLINK_OUT_OF_MEMORY,
                        format!("starting the link's progress thread: {error}"),
                    )
                })?;
        }
        Ok(cell)
    }

    /// Ends the link in order (queued messages first, then the peer is
    /// told), waiting at most `timeout`; then frees everything. The caller
    /// already removed the handle.
    pub(crate) fn close(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        // A poisoned state is dropped all the same.
        let mut state = self.acquire().unwrap_or_else(|p| p.into_inner());
        state.closed_by_handle = true;
        let result = loop {
            let Some(link) = state.link.as_mut() else {
                break Ok(());
            };
            match link.close(Duration::ZERO) {
                Ok(()) => break Ok(()),
                Err(IoError::Timeout { .. }) => {}
                Err(other) => break Err(Error::new(end_of(&other).0, other.to_string())),
            }
            if start.elapsed() >= timeout {
                break Err(Error::new(
                    BARLINK_TIMEOUT,
                    format!(
                        "the orderly close did not finish within {} ms (messages unacknowledged, or the peer did not answer); the link is closed anyway",
                        timeout.as_millis()
                    ),
                ));
            }
            // Let calls on other threads see the close.
            drop(state);
            std::thread::yield_now();
            state = self.acquire().unwrap_or_else(|p| p.into_inner());
        };
        state.link = None;
        state.requests.clear();
        state.copies_held = 0;
        state.copies_reserved = 0;
        state.recvs = PostedRecvs::default();
        state.done.clear();
        state.received.clear();
        // Freed now, not with the cell: threads that used the link keep
        // the emptied cell until their next lookup (`registry::with_link`).
        state.held = HeldMessages::default();
        state.send_copies = SendCopies::default();
        state.loan_outcomes.clear();
        result
    }
}

impl LinkState {
    /// Whether the state holds no memory of the link's: no message lent
    /// out, no spare copy, no loan's outcome.
    #[cfg(test)]
    pub(crate) fn holds_nothing(&self) -> bool {
        self.held.len() == 0 && self.send_copies.is_empty() && self.loan_outcomes.is_empty()
    }

    pub(crate) fn end_error(&self) -> Option<Error> {
        self.end
            .as_ref()
            .map(|(status, message)| Error::new(*status, message.clone()))
    }

    /// [`LinkState::step`] for a receive waiting for its message.
    fn step_for_delivery(&mut self) -> bool {
        self.for_delivery = true;
        let moved = self.step();
        self.for_delivery = false;
        moved
    }

    /// One round of progress: moves packets, takes as many delivered
    /// messages as a receive is waiting for, collects completions.
    /// Returns whether anything moved.
    ///
    /// Messages nobody waits for stay in the engine, holding the credit
    /// they took, so a peer that sends faster than this side receives
    /// waits for it: taking every message here let the sender run ahead
    /// while they queued, each in a new buffer, without bound.
    pub(crate) fn step(&mut self) -> bool {
        let Some(link) = self.link.as_mut() else {
            self.settle_recvs();
            return false;
        };
        let before = activity(link.engine_stats());
        // One round per step, as the Rust link's calls take: a message
        // taken here frees credit, and the acknowledgement the engine held
        // back for a reply goes with the next round (the reply's, usually),
        // not in a round of its own.
        let mut ended = match link.progress_waiting(!self.waiting, self.for_delivery) {
            // A blocking call's later rounds, while nothing moves, no
            // message waits, nothing waits to be collected and nothing
            // ended (another thread's receive round may have brought
            // completions or an end without collecting them): the rest of
            // the step would find nothing. This is the loop a waiting call
            // spins in.
            Ok(false)
                if self.waiting
                    && self.received.is_empty()
                    && link.messages_ready() == 0
                    && !link.has_sent_back()
                    && link.check_open().is_ok() =>
            {
                return false;
            }
            Ok(_) => None,
            Err(error) => Some(error),
        };
        let wanted = self.recvs.len().max(1);
        let mut delivered = false;
        while self.received.len() < wanted {
            let Some(delivery) = link.take_delivery() else {
                break;
            };
            self.message_bytes_received += delivery.len() as u64;
            self.received.push_back(delivery);
            delivered = true;
        }
        // A receive that has its message returns with it at once when
        // nothing waits to be collected: whether the link ended is then
        // the next step's question, which usually runs after the caller's
        // answer has gone out.
        if delivered
            && self.for_delivery
            && ended.is_none()
            && self.recvs.is_empty()
            && !link.has_sent_back()
        {
            return true;
        }
        if ended.is_none() {
            ended = link.check_open().err();
        }
        if ended.is_some() {
            self.keep_delivered();
        }
        let moved = self
            .link
            .as_ref()
            .is_some_and(|link| activity(link.engine_stats()) != before);
        self.collect(ended);
        self.settle_recvs();
        moved
    }

    /// Before a link that ended goes: keeps every message delivered before
    /// the end (nothing more can come), as every round that finds an end
    /// must.
    pub(crate) fn keep_delivered(&mut self) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        while let Ok(Some(delivery)) = link.try_recv_delivery() {
            self.message_bytes_received += delivery.len() as u64;
            self.received.push_back(delivery);
        }
    }

    /// Completes the posted receives that delivered messages are for, and
    /// lends the rest's buffers to the link; once the link has ended, fails
    /// those that no delivered message is left for.
    fn settle_recvs(&mut self) {
        if self.recvs.is_empty() {
            return;
        }
        self.recvs
            .settle(self.link.as_mut(), &mut self.received, &mut self.done);
        if self.link.is_none()
            && self.received.is_empty()
            && let Some((status, _)) = &self.end
        {
            self.recvs.fail_all(*status, &mut self.done);
        }
    }

    /// Posts a receive into `memory` (`capacity` bytes) without waiting;
    /// returns the request id.
    pub(crate) fn post_recv(
        &mut self,
        memory: CallerMemory,
        capacity: usize,
        user_tag: u64,
    ) -> Result<u64> {
        if self.link.is_none() && self.received.is_empty() {
            return Err(self
                .end_error()
                .unwrap_or_else(|| Error::new(BARLINK_CLOSED, "the link is closed")));
        }
        let request = self.recvs.add(memory, capacity, user_tag);
        // Lent to the link at once, without a round of progress: a caller
        // posting a batch lends it all before any of it fills, and the
        // next call's round lands messages in it.
        self.settle_recvs();
        Ok(request)
    }

    /// Turns the payloads the link handed back into completions; ends the
    /// link on `ended`.
    fn collect(&mut self, ended: Option<IoError>) {
        self.take_sent_back();
        let Some(link) = self.link.as_mut() else {
            return;
        };
        if let Some(error) = ended {
            self.end = Some(end_of(&error));
            self.final_stats = link.engine_stats().clone();
            self.final_in_place = link.sent_in_place();
            // Dropping the link drops every payload it held: from here on
            // barlink reads none of the caller's memory.
            self.link = None;
        }
        self.complete_returned();
    }

    /// Queues `payload` (whose memory `source` names); gives both back when
    /// the send queue is full.
    fn try_send(
        &mut self,
        payload: Payload,
        source: PayloadSource,
        user_tag: u64,
        report: bool,
    ) -> Result<std::result::Result<u64, (Payload, PayloadSource)>> {
        if let Some(error) = self.end_error() {
            return Err(error);
        }
        let Some(link) = self.link.as_mut() else {
            return Err(Error::new(BARLINK_CLOSED, "the link is closed"));
        };
        let len = payload.as_ref().len() as u64;
        match link.try_send(payload) {
            Ok(MessageId(id)) => {
                if matches!(source, PayloadSource::Loan(_)) && copies_lent_tails(&link.link) {
                    // Its blocking send returns once only the last packets
                    // are unacknowledged (`barlink::loan::copies_tail`).
                    link.ack_before_tail(MessageId(id));
                }
                self.keep_request(id, len, source, user_tag, report);
                Ok(Ok(id))
            }
            Err(SendError::QueueFull(payload)) => Ok(Err((payload, source))),
            Err(SendError::TooLong { len, max, .. }) => Err(Error::new(
                BARLINK_MESSAGE_TOO_LONG,
                format!("message of {len} bytes exceeds max_message_bytes {max}"),
            )),
            Err(error) => {
                // Closing or closed: one step learns why.
                self.step();
                Err(self
                    .end_error()
                    .unwrap_or_else(|| Error::new(BARLINK_CLOSED, error.to_string())))
            }
        }
    }

    pub(crate) fn check_len(&self, len: usize) -> Result<()> {
        if len as u64 > self.limits.max_message_len {
            return Err(Error::new(
                BARLINK_MESSAGE_TOO_LONG,
                format!(
                    "message of {len} bytes exceeds max_message_bytes {}",
                    self.limits.max_message_len
                ),
            ));
        }
        Ok(())
    }

    /// Copies `data` into a buffer barlink owns (its length already passed
    /// [`LinkState::check_len`], before the send-queue limit was asked),
    /// refusing allocation failure without aborting.
    pub(crate) fn copy_payload(&mut self, data: &[u8]) -> Result<(Payload, PayloadSource)> {
        self.send_copies.copy(data)
    }

    /// Whether a copy of `len` more bytes fits under `send_queue_bytes`:
    /// always while no copy is held, so a message larger than the limit
    /// still goes, alone.
    pub(crate) fn copy_fits(&self, len: usize) -> bool {
        let held = self.copies_held.saturating_add(self.copies_reserved);
        held == 0 || held.saturating_add(len as u64) <= self.limits.queue_bytes
    }

    /// A spare buffer for a posted send's copy of `len` bytes, if the
    /// copy fits under the limit now or after one round of progress (which
    /// may bring acknowledgements); [`crate::payload::fill_copy`] makes it
    /// the payload. A copy made outside the lock reserves its bytes first
    /// ([`LinkState::reserve_copy`]).
    pub(crate) fn spare_to_post(&mut self, len: usize) -> Result<Vec<u8>> {
        self.check_len(len)?;
        if !self.copy_fits(len) {
            self.step();
            if !self.copy_fits(len) {
                // A caller polling a full queue retries often: no text
                // is made per try.
                return Err(Error::fixed(
                    BARLINK_WOULD_BLOCK,
                    c"barlink_post_send: the copies of unacknowledged sends reached send_queue_bytes: poll completions and retry",
                ));
            }
        }
        Ok(self.send_copies.take(len))
    }

    /// A spare buffer for a blocking send's copy of `data`, if the send
    /// copies (it does not lend: see [`LinkState::blocking_payload`]) and
    /// the copy fits under the limit now; else the send makes its payload
    /// in its steps.
    pub(crate) fn spare_to_send(&mut self, data: &[u8]) -> Result<Option<Vec<u8>>> {
        self.check_len(data.len())?;
        if self.lends(data) || !self.copy_fits(data.len()) {
            return Ok(None);
        }
        Ok(Some(self.send_copies.take(data.len())))
    }

    /// Counts `len` bytes of a copy about to be made outside the lock
    /// against the limit, so that calls on other threads meanwhile see
    /// them, until the lock that queues the copy gives them back
    /// ([`LinkState::end_reservation`], [`LinkCell::lock_after_copy`]).
    pub(crate) fn reserve_copy(&mut self, len: usize) {
        self.copies_reserved += len as u64;
    }

    /// Gives back `len` bytes that a copy made outside the lock reserved.
    pub(crate) fn end_reservation(&mut self, len: usize) {
        // A close meanwhile cleared every reservation.
        self.copies_reserved = self.copies_reserved.saturating_sub(len as u64);
    }

    /// Whether a blocking send lends `data` to the link rather than copy
    /// it: a message long enough that waiting for the acknowledgement
    /// costs less than a copy. An RDMA link's adapter reads bytes in
    /// registered send memory in place, and a write of them may still be
    /// queued when the call returns: those are never lent to it.
    fn lends(&self, data: &[u8]) -> bool {
        let adapter_reads_in_place = self
            .link
            .as_ref()
            .is_some_and(|link| matches!(link.link, AnyLink::Rdma(_)));
        data.len() as u64 >= self.limits.loan_from
            && !(adapter_reads_in_place && SendMemory::overlaps(data))
    }

    /// The payload of a blocking send of `data`: the caller's bytes, lent
    /// for the call, if it [lends](LinkState::lends) them, else a copy.
    /// The lent bytes come with the call's handle to them, which it must
    /// settle ([`LinkState::settle_loan`]) before it returns.
    pub(crate) fn blocking_payload(
        &mut self,
        data: &[u8],
    ) -> Result<(Payload, PayloadSource, Option<Weak<SendLoan>>)> {
        if self.lends(data) {
            let (payload, source, loan) = SendLoan::new(data);
            return Ok((payload, source, Some(loan)));
        }
        let (payload, source) = self.copy_payload(data)?;
        Ok((payload, source, None))
    }

    /// The engine's counters: the link's, or its last ones once it ended.
    pub(crate) fn engine_stats(&self) -> &barlink::Stats {
        match &self.link {
            Some(link) => link.engine_stats(),
            None => &self.final_stats,
        }
    }

    /// The offset of the first byte of queued message `msg_id` the link may
    /// still read; `None` once it let go of the message, or if the link
    /// ended.
    fn needed_from(&self, msg_id: u64) -> Option<u64> {
        self.link.as_ref()?.needed_from(MessageId(msg_id))
    }

    /// Whether a blocking send that lent message `msg_id` may copy what the
    /// link still reads of it and return: on a link that does so
    /// ([`copies_lent_tails`]), every packet the link queued is in the
    /// peer's ring (the peer gets the message without another call,
    /// unless a packet is lost), and only the message's last ones are
    /// unacknowledged ([`barlink::loan::copies_tail`]).
    pub(crate) fn may_copy_tail_and_return(&mut self, msg_id: u64, len: usize) -> bool {
        let Some(link) = self.link.as_mut() else {
            return false;
        };
        if !copies_lent_tails(&link.link) || link.has_unsent() {
            return false;
        }
        self.needed_from(msg_id).is_some_and(|from| {
            barlink::loan::copies_tail(len as u64 - from, self.limits.max_payload)
        })
    }

    /// Whether the message `msg_id` of a blocking send that lent its
    /// bytes ended (the link let go of them): [`LinkState::settle_loan`]
    /// then says how.
    pub(crate) fn loan_ended(&self, msg_id: u64) -> bool {
        self.loan_outcomes.contains_key(&msg_id)
    }

    /// Ends a blocking send's `loan` (message `msg_id`, if the call
    /// learned it: a panic may come first) before the call returns: the
    /// outcome if the link let go of the bytes, else a copy in their
    /// place, so that the message still goes and the caller may reuse its
    /// memory. `Ok` means the message was acknowledged or is queued with
    /// its copy (or was never queued).
    pub(crate) fn settle_loan(&mut self, msg_id: Option<u64>, loan: &Weak<SendLoan>) -> Result<()> {
        // A payload handed back and not yet collected still holds a count.
        // Not while unwinding: the state a panic left is not collected
        // (a second panic would abort); a needless backup is all it costs.
        if !std::thread::panicking() {
            self.collect(None);
        }
        if let Some(status) = msg_id.and_then(|id| self.loan_outcomes.remove(&id)) {
            return match status {
                BARLINK_OK => Ok(()),
                status => Err(self.end_error().unwrap_or_else(|| {
                    Error::new(
                        status,
                        "the link ended before the peer acknowledged the message",
                    )
                })),
            };
        }
        if let Some(request) = self
            .requests
            .iter_mut()
            .find_map(|(id, request)| (Some(*id) == msg_id).then_some(request))
        {
            // Its outcome is reported to nobody now: the call returns.
            request.awaited = false;
        }
        // The request holds one count, the link's payload (in the engine,
        // or handed back and not yet collected) the other.
        let Some(loan) = loan.upgrade().filter(|_| loan.strong_count() > 2) else {
            // The link let go of the bytes (the message was never queued,
            // or its outcome was taken already): none of the caller's
            // memory is read any more.
            return Ok(());
        };
        // Only what the link may still read: the bytes from the first
        // packet not yet acknowledged on (all of them if it cannot tell).
        let from = msg_id
            .and_then(|id| self.needed_from(id))
            .map_or(0, |from| from as usize);
        let unacknowledged = loan.message_len().saturating_sub(from) as u64;
        let tail_only = barlink::loan::copies_tail(unacknowledged, self.limits.max_payload);
        match self.send_copies.back_up(&loan, from, tail_only) {
            Ok(capacity) => {
                self.copies_held += capacity;
                // A copy of the last packets only leaves the message lent.
                self.messages_copied += u64::from(capacity > 0 && !tail_only);
                #[cfg(test)]
                {
                    self.tails_copied += u64::from(tail_only);
                }
                Ok(())
            }
            Err(error) => {
                // The link's payload must be the last count, so that
                // dropping the link releases the request.
                drop(loan);
                // The call cannot return while the link reads its memory,
                // nor wait for the peer without bound: the link ends,
                // dropping the payload.
                self.abandon(
                    error.status,
                    "a blocking send could not copy its message, which the peer had not acknowledged, before returning (out of memory): the link was closed".into(),
                );
                Err(error)
            }
        }
    }

    /// Ends the link for `why`, as a failure found inside it does.
    fn abandon(&mut self, status: barlink_status, why: String) {
        self.take_sent_back();
        let Some(link) = self.link.take() else {
            return;
        };
        self.final_stats = link.engine_stats().clone();
        self.final_in_place = link.sent_in_place();
        self.end.get_or_insert((status, why));
        // Dropping the link drops every payload it held.
        drop(link);
        self.complete_returned();
    }

    /// One step of a blocking send of `payload` (taken out of `slot`):
    /// the message's id once it is queued.
    pub(crate) fn send_step(
        &mut self,
        slot: &mut Option<(Payload, PayloadSource)>,
    ) -> Result<Step<u64>> {
        let Some((payload, source)) = slot.take() else {
            return Err(Error::new(
                BARLINK_INTERNAL,
                "a blocking send stepped with no payload to queue",
            ));
        };
        match self.try_send(payload, source, 0, false)? {
            Ok(msg_id) => {
                self.step();
                Ok(Step::Done(msg_id))
            }
            Err(back) => {
                *slot = Some(back);
                Ok(Step::Again { moved: self.step() })
            }
        }
    }

    /// Posts a send without waiting; returns the request id.
    pub(crate) fn post(
        &mut self,
        payload: Payload,
        source: PayloadSource,
        user_tag: u64,
    ) -> Result<u64> {
        // A message on a local (host-memory) ring link goes the direct
        // way, as a blocking send's does.
        let direct = self.ready_for_direct_send();
        let (payload, source) = if direct {
            match self.queue_direct(payload, source, user_tag, true) {
                Ok(msg_id) => return Ok(msg_id + 1),
                Err(back) => back,
            }
        } else {
            (payload, source)
        };
        self.post_queued(payload, source, user_tag)
            .map(|msg_id| msg_id + 1)
    }

    /// Queues a posted send's payload the general way, with a step; the
    /// message id, or `BARLINK_WOULD_BLOCK` when the queue is full (the
    /// payload's copy goes back to the spares).
    pub(crate) fn post_queued(
        &mut self,
        payload: Payload,
        source: PayloadSource,
        user_tag: u64,
    ) -> Result<u64> {
        match self.try_send(payload, source, user_tag, true)? {
            Ok(msg_id) => {
                self.step();
                Ok(msg_id)
            }
            Err((payload, source)) => {
                self.keep_unsent(payload, source);
                self.step();
                Err(Error::fixed(
                    BARLINK_WOULD_BLOCK,
                    c"barlink_post_send: the send queue is full: poll completions and retry",
                ))
            }
        }
    }

    /// Takes back a send's payload that never went into the queue (it was
    /// full): a caller retrying a full queue should not allocate a copy
    /// per try, so the copy goes back to the spares.
    pub(crate) fn keep_unsent(&mut self, payload: Payload, source: PayloadSource) {
        self.send_copies.give_back(payload);
        self.send_copies.reclaim(source);
    }

    /// One step of a receive into `into`: the next message lands in the
    /// caller's buffer (posted to the link on the first step, so the
    /// message is assembled there), or is copied there by `deliver` if it
    /// arrived elsewhere; a message larger than the buffer is kept and its
    /// size reported. The call that owns `into` must [`LinkState::reclaim`]
    /// it before returning, whatever the outcome.
    pub(crate) fn recv_step(
        &mut self,
        into: &mut RecvInto,
        deliver: &mut dyn FnMut(&[u8]),
    ) -> Result<Step<usize>> {
        self.refuse_while_posted("barlink_recv")?;
        let mut moved = false;
        if self.received.is_empty() {
            // Lend the buffer only while the engine holds nothing of the
            // peer's: a message already begun is delivered elsewhere and
            // copied in, and a buffer lent meanwhile would catch the start
            // of the next one, only to be taken back, its bytes moved to
            // a buffer of the engine's, before the copy.
            if let Some(link) = self.link.as_mut()
                && into.posted.is_none()
                && !link.holds_unreceived()
                && let Some(target) = into.target.take()
            {
                into.posted = Some(link.post_recv(Box::new(target)));
            }
            moved = self.step_for_delivery();
        }
        if let Some(front) = self.received.front() {
            let ours =
                matches!(front, Delivery::Landed { recv, .. } if Some(recv.id()) == into.posted);
            if ours {
                into.posted = None;
                self.recvs_landed += 1;
                let delivery = self.received.pop_front().expect("checked above");
                return Ok(Step::Done(delivery.len()));
            }
            // It arrived elsewhere: take the buffer back before copying
            // into it, so that nothing else lands there meanwhile.
            if let Some(id) = into.posted.take() {
                self.reclaim(id);
            }
            let len = self.received.front().map_or(0, Delivery::len);
            if len > into.capacity {
                return Err(Error::new(
                    BARLINK_BUFFER_TOO_SMALL,
                    format!(
                        "the next message has {len} bytes, the buffer {}: it is kept for the next call",
                        into.capacity
                    ),
                )
                .with_needed(len));
            }
            match self.received.pop_front().expect("checked above") {
                Delivery::Message { data, .. } => {
                    deliver(&data);
                    if let Some(link) = self.link.as_mut() {
                        link.recycle(data);
                    }
                }
                // Another call's buffer, still in that call: read it now.
                Delivery::Landed { recv, len, .. } => {
                    let mut target = recv.into_target();
                    deliver(&target.bytes_mut()[..len]);
                }
            }
            return Ok(Step::Done(len));
        }
        if let Some(error) = self.end_error() {
            return Err(error);
        }
        Ok(Step::Again { moved })
    }

    /// Posted receives take the next messages first: a call that takes
    /// one now would take it out of turn.
    fn refuse_while_posted(&self, call: &str) -> Result<()> {
        if self.recvs.is_empty() {
            return Ok(());
        }
        Err(Error::new(
            BARLINK_BUSY,
            format!(
                "{} posted receive(s) are pending and take the next messages first: \
                 wait for their completions (barlink_poll) before {call}",
                self.recvs.len()
            ),
        ))
    }

    /// One step of a receive in place: the next message's buffer is
    /// handed to the caller as it lies (a message that landed in another
    /// call's buffer is copied out first).
    pub(crate) fn recv_message_step(&mut self) -> Result<Step<Lent>> {
        self.refuse_while_posted("barlink_recv_message")?;
        let mut moved = false;
        if self.received.is_empty() {
            moved = self.step_for_delivery();
        }
        if let Some(delivery) = self.received.pop_front() {
            return Ok(Step::Done(self.hold(delivery)));
        }
        if let Some(error) = self.end_error() {
            return Err(error);
        }
        Ok(Step::Again { moved })
    }

    /// Lends a delivered message to the caller in place (one that landed
    /// in another call's buffer is copied out first).
    fn hold(&mut self, delivery: Delivery) -> Lent {
        let data = match delivery {
            Delivery::Message { data, .. } => data,
            Delivery::Landed { recv, len, .. } => {
                let mut target = recv.into_target();
                target.bytes_mut()[..len].to_vec()
            }
        };
        self.held.hold(data)
    }

    /// Gives a message received in place back; its buffer goes on to hold
    /// a later message.
    pub(crate) fn release_message(&mut self, lent: Lent) -> Result<()> {
        let data = self.held.release(lent)?;
        if let Some(link) = self.link.as_mut() {
            link.recycle(data);
        }
        Ok(())
    }

    /// Takes posted buffer `id` back from the link, and out of the
    /// delivered messages: one that landed there and was not taken is
    /// copied out and keeps its place. Afterwards barlink never writes
    /// that buffer again.
    pub(crate) fn reclaim(&mut self, id: PostId) {
        crate::recv::reclaim(self.link.as_mut(), &mut self.received, id);
    }

    /// Cancels posted receive `request` (see `barlink_cancel`).
    pub(crate) fn cancel(&mut self, request: u64) -> Result<()> {
        if request & RECV_REQUEST == 0 {
            return Err(Error::invalid(format!(
                "request {request} is not a posted receive's: only receives can be cancelled (a posted send's bytes may be on their way already; closing the link drops what is unsent)"
            )));
        }
        if self.done.contains(request) {
            // Completed before the cancel: its completion says how.
            return Ok(());
        }
        let found = self.recvs.cancel(
            self.link.as_mut(),
            &mut self.received,
            &mut self.done,
            request,
        );
        if !found {
            return Err(Error::invalid(format!(
                "no posted receive {request} is pending: the id is unknown, or its completion was reported already"
            )));
        }
        self.settle_recvs();
        Ok(())
    }

    /// Drives progress once and hands up to `max` completions to `take`,
    /// oldest first (into the caller's array: no buffer in between);
    /// returns how many.
    pub(crate) fn poll(&mut self, max: usize, mut take: impl FnMut(barlink_completion)) -> usize {
        self.step();
        let mut taken = 0;
        while taken < max {
            match self.done.pop_first() {
                Some(completion) => take(completion),
                None => break,
            }
            taken += 1;
        }
        taken
    }

    /// The state of one request: `Ok` (reported now), pending, or the
    /// failure (reported now).
    pub(crate) fn test(&mut self, request: u64) -> Result<Step<()>> {
        Ok(match self.take_completion(request)? {
            Step::Done(completion) => Step::Done(self.outcome(&completion)?),
            Step::Again { moved } => Step::Again { moved },
        })
    }

    /// One request's completion, taken (reported now) once it finished,
    /// driving the link once if it has not; `Err` for an id that is not a
    /// posted request's or was reported already.
    pub(crate) fn take_completion(&mut self, request: u64) -> Result<Step<barlink_completion>> {
        let mut moved = false;
        if !self.done.contains(request) {
            // Only posted requests have ids to test (a blocking send's
            // internal entry is not one).
            let posted = if request & RECV_REQUEST != 0 {
                self.recvs.contains(request)
            } else {
                request
                    .checked_sub(1)
                    .and_then(|index| {
                        let at = self.requests.binary_search_by_key(&index, |(id, _)| *id);
                        at.ok().map(|at| &self.requests[at].1)
                    })
                    .is_some_and(|entry| entry.report)
            };
            if !posted {
                return Err(Error::invalid(format!(
                    "request {request} is unknown on this link, or its completion was already reported"
                )));
            }
            moved = self.step();
        }
        Ok(match self.done.remove(request) {
            Some(completion) => Step::Done(completion),
            None => Step::Again { moved },
        })
    }

    /// How a reported request finished, as `barlink_test` and
    /// `barlink_wait` return it: `Ok`, or the error its status names.
    pub(crate) fn outcome(&self, completion: &barlink_completion) -> Result<()> {
        let request = completion.request;
        match completion.status {
            BARLINK_OK => Ok(()),
            BARLINK_BUFFER_TOO_SMALL => Err(Error::new(
                BARLINK_BUFFER_TOO_SMALL,
                format!(
                    "request {request}: the next message has {} bytes, more than the posted \
                     buffer holds; it stays first in line for the next receive",
                    completion.bytes
                ),
            )
            .with_needed(usize::try_from(completion.bytes).unwrap_or(usize::MAX))),
            BARLINK_CANCELED => Err(Error::new(
                BARLINK_CANCELED,
                format!("request {request}: the posted receive was cancelled (barlink_cancel)"),
            )),
            status => Err(self.end_error().unwrap_or_else(|| {
                Error::new(
                    status,
                    format!("request {request} failed: the session ended before the peer acknowledged it"),
                )
            })),
        }
    }

    /// One step of a flush: done when every queued message is acknowledged.
    pub(crate) fn flush_step(&mut self) -> Result<Step<()>> {
        let moved = self.step();
        if self.requests.is_empty() && !self.any_failed {
            // Everything acknowledged, even if the peer closed since.
            return Ok(Step::Done(()));
        }
        if let Some(error) = self.end_error() {
            return Err(error);
        }
        if self.any_failed {
            return Err(Error::new(
                BARLINK_LINK_FAILED,
                "a message failed: the peer restarted before acknowledging it",
            ));
        }
        Ok(Step::Again { moved })
    }

    pub(crate) fn progress(&mut self) -> Result<()> {
        self.step();
        match self.end_error() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// The path the link took and why, e.g. `tcp: the peer is on another
    /// node ...`.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn stats(&self) -> barlink_stats {
        let (engine, (packets_in_place, bytes_in_place)) = match &self.link {
            Some(link) => (link.engine_stats(), link.sent_in_place()),
            None => (&self.final_stats, self.final_in_place),
        };
        barlink_stats {
            struct_size: 0,
            reserved: 0,
            messages_sent: engine.messages_sent,
            message_bytes_sent: self.message_bytes_sent,
            messages_received: engine.messages_delivered,
            message_bytes_received: self.message_bytes_received,
            packets_sent: engine.packets_sent,
            packets_received: engine.packets_received,
            retransmits: engine.retransmits(),
            crc_failures: engine.crc_failures,
            malformed: engine.malformed,
            duplicates: engine.duplicates,
            credit_stalls: engine.credit_stalls,
            requests_in_flight: (self.requests.iter().filter(|(_, r)| r.report).count()
                + self.done.len()) as u64,
            messages_held: self.held.len() as u64,
            packets_sent_in_place: packets_in_place,
            bytes_sent_in_place: bytes_in_place,
            messages_copied: self.messages_copied,
            messages_lent: self.messages_lent,
            messages_landed: self.recvs_landed + self.recvs.landed(),
        }
    }
}

/// The progress thread: one step at a time under the lock, so calls on
/// the link interleave with it; yields while idle, then naps, so an idle
/// link costs little CPU. Ends when the handle is closed or the link
/// ended (what arrived stays for the caller to receive).
fn drive(cell: &std::sync::Weak<LinkCell>) {
    /// Idle rounds that only yield before the thread starts napping.
    const YIELDS_BEFORE_NAPS: u32 = 64;
    /// A nap between idle rounds.
    const NAP: Duration = Duration::from_micros(50);
    let mut idle_rounds: u32 = 0;
    loop {
        let Some(cell) = cell.upgrade() else {
            return;
        };
        let moved = {
            let Ok(mut state) = cell.acquire() else {
                return;
            };
            if state.closed_by_handle || state.link.is_none() {
                return;
            }
            state.step()
        };
        drop(cell);
        if moved {
            idle_rounds = 0;
        } else if idle_rounds < YIELDS_BEFORE_NAPS {
            idle_rounds += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
    }
}

/// A link whose lock a caught panic poisoned.
fn unusable() -> Error {
    Error::new(
        BARLINK_INTERNAL,
        "the link is unusable after an internal error: close it",
    )
}

/// A link closed by its handle while a call was using it.
fn closed_meanwhile() -> Error {
    Error::new(
        BARLINK_CLOSED,
        "the link was closed (barlink_close) while this call was using it",
    )
}

fn activity(stats: &Stats) -> (u64, u64) {
    (stats.packets_sent, stats.packets_received)
}
