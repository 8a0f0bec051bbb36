//! `barlink.Link` and `barlink.Request`: a [`Connection`] behind a mutex,
//! every blocking call run without the GIL in slices, so other Python
//! threads run, Ctrl-C is seen within a slice, and a send on one thread
//! and a receive on another take turns on the link.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::time::{Duration, Instant};

use barlink::rdma::SendMemory;
use barlink::{Connection, SendError};
use barlink_transport::link::IoError;
use barlink_transport::{Delivery, MessageId};
use pyo3::exceptions::{PyBlockingIOError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::buffer::{self, BufferView, Graveyard, LandingView, Message, SendLoan, Spares};
use crate::errors::{self, Raisable, closed_here};
use crate::lend;

/// Longest one wait runs without the GIL before it checks for signals.
const SLICE: Duration = Duration::from_millis(50);
/// Longest a waiting call holds its link's lock at a stretch, so another
/// thread's call on the same link (a send beside a waiting receive) gets
/// its turn within about this long.
const HOLD: Duration = Duration::from_micros(50);
/// Longest a waiting call stands aside, between its stretches, for calls
/// of other threads queued on the lock.
const STAND_ASIDE: Duration = Duration::from_millis(5);
/// Messages up to this size are copied while the GIL is held; larger ones
/// are copied without it.
const COPY_WITH_GIL_UP_TO: usize = 64 << 10;
/// Read-only messages up to this size are copied all the same: a copy
/// costs less than holding the view and releasing it later.
const HOLD_FROM: usize = 4 << 10;
/// Bytes of copied messages (writable buffers given to `send`) held until
/// the peer acknowledges them; past it, `send` waits.
const COPY_BUDGET: usize = 64 << 20;

/// A message as the engine holds it until acknowledged.
#[derive(Debug)]
pub enum Payload {
    /// A copy (the caller may reuse its buffer at once).
    Copied(Vec<u8>),
    /// The caller's memory, read in place.
    Held(HeldView),
    /// A range of the caller's memory, one of several messages cut from
    /// one buffer (a collective's chunks); the view is released when the
    /// last of them is acknowledged.
    HeldRange(Arc<HeldView>, std::ops::Range<usize>),
    /// A writable buffer lent for one `send` call, or the copy that took
    /// its place when the call returned first (`lend`).
    Lent(Arc<SendLoan>),
}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        match self {
            Payload::Copied(bytes) => bytes,
            Payload::Held(held) => held.bytes(),
            Payload::HeldRange(held, range) => held.range(range.clone()),
            Payload::Lent(lent) => lent.bytes(),
        }
    }
}

/// A view whose release waits for the GIL: dropped by the engine when the
/// peer acknowledged the message, possibly without the GIL.
#[derive(Debug)]
pub struct HeldView {
    view: Option<BufferView>,
    graveyard: Arc<Graveyard>,
}

impl HeldView {
    pub fn new(view: BufferView, graveyard: Arc<Graveyard>) -> HeldView {
        HeldView {
            view: Some(view),
            graveyard,
        }
    }

    fn bytes(&self) -> &[u8] {
        self.view.as_ref().map_or(&[], BufferView::bytes)
    }

    /// The held bytes of `range` (none where it lies outside them), read
    /// without making a slice of the rest.
    pub fn range(&self, range: std::ops::Range<usize>) -> &[u8] {
        match &self.view {
            Some(view) if range.start <= range.end && range.end <= view.len() => view.range(range),
            _ => &[],
        }
    }

    /// Where the held bytes lie (see `BufferView::span`).
    pub fn span(&self) -> std::ops::Range<usize> {
        self.view.as_ref().map_or(0..0, BufferView::span)
    }
}

impl Drop for HeldView {
    fn drop(&mut self) {
        if let Some(view) = self.view.take() {
            self.graveyard.bury(view);
        }
    }
}

/// Why a call on the link failed, made into an exception with the GIL.
#[derive(Debug)]
pub enum Failure {
    Io(IoError),
    ClosedHere,
    Busy,
    /// A collective's peer sent what this side did not expect.
    Mismatch(String),
    /// A collective interrupted where it cannot go on.
    Interrupted(&'static str),
}

impl Failure {
    pub fn into_py(self) -> PyErr {
        self.into_raisable().raise()
    }

    /// The exception, to raise later (and again).
    pub fn into_raisable(self) -> Raisable {
        match self {
            Failure::Io(error) => errors::io_raisable(error),
            Failure::ClosedHere => errors::closed_here_raisable(),
            Failure::Busy => Raisable::new(
                PyBlockingIOError::new_err,
                "the send queue is full: wait on an earlier request, or call progress()",
            ),
            Failure::Mismatch(why) => Raisable::new(errors::Mismatch::new_err, why),
            Failure::Interrupted(why) => Raisable::new(PyRuntimeError::new_err, why),
        }
    }
}

impl From<IoError> for Failure {
    fn from(error: IoError) -> Self {
        Failure::Io(error)
    }
}

#[derive(Debug)]
pub struct State {
    pub conn: Option<Connection<Payload>>,
    /// Messages queued so far: the next one's index.
    queued: u64,
    /// A message `recv_into` could not take (too large): first in line.
    pending: Option<Vec<u8>>,
    /// Copied messages not yet acknowledged: (index, bytes).
    copied: VecDeque<(u64, usize)>,
    copied_bytes: usize,
    /// Buffers lent to the link by `send` calls in progress (`lend`):
    /// backed up before the link is driven without the lock (`close`).
    loans: Vec<Weak<SendLoan>>,
    /// `send`s whose bytes were copied: short messages, writable buffers
    /// below the lending size, and lent ones copied when the call returned
    /// before the acknowledgement.
    pub messages_copied: u64,
    /// `send`s of writable buffers read in place and acknowledged within
    /// the call (`bytes` held in place count in neither).
    pub messages_lent: u64,
}

impl State {
    /// Whether a message `recv_into` could not take waits first in line.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    pub fn conn(&mut self) -> Result<&mut Connection<Payload>, Failure> {
        self.conn.as_mut().ok_or(Failure::ClosedHere)
    }

    /// Forgets copies the peer acknowledged.
    fn settle(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let completed = conn.completed();
        while let Some(&(index, len)) = self.copied.front() {
            if index >= completed {
                break;
            }
            self.copied.pop_front();
            self.copied_bytes -= len;
        }
    }

    /// One step of waiting until every queued packet went out at least
    /// once (see `Link::send_all`), for at most `slice`.
    pub fn push_step(state: &mut State, slice: Duration) -> Result<Option<()>, Failure> {
        let conn = state.conn()?;
        let done = |conn: &mut Connection<Payload>| !conn.has_unsent() || conn.holds_unreceived();
        if done(conn) {
            return Ok(Some(()));
        }
        let started = Instant::now();
        loop {
            let moved = conn.progress()?;
            if done(conn) {
                return Ok(Some(()));
            }
            if started.elapsed() >= slice {
                return Ok(None);
            }
            if !moved {
                std::thread::yield_now();
            }
        }
    }

    /// Notes a buffer a `send` call lent to the link (see `loans`).
    pub fn lend(&mut self, loan: Weak<SendLoan>) {
        self.loans.push(loan);
    }

    /// Forgets `loan` (its call settles it), and loans that ended.
    pub fn forget_loan(&mut self, loan: &Arc<SendLoan>) {
        self.loans.retain(|lent| {
            lent.strong_count() > 0 && !std::ptr::eq(lent.as_ptr(), Arc::as_ptr(loan))
        });
    }

    /// Counts a copy of message `index`'s `len` bytes, made after it was
    /// queued (a lent message's), against the budget of copies until the
    /// peer acknowledges it.
    pub fn hold_copy(&mut self, index: u64, len: usize) {
        let at = self.copied.partition_point(|&(queued, _)| queued < index);
        self.copied.insert(at, (index, len));
        self.copied_bytes += len;
    }

    /// Queues `payload` (retrying while the queue is full, for at most
    /// `slice`); its index, or the payload back if there was no room.
    pub fn queue(
        &mut self,
        payload: Payload,
        slice: Duration,
    ) -> Result<Result<u64, Payload>, Failure> {
        let copied = match &payload {
            Payload::Copied(bytes) => bytes.len(),
            Payload::Held(_) | Payload::HeldRange(..) | Payload::Lent(_) => 0,
        };
        // A lent message may become a copy (`lend`): it waits for room
        // for one as a copy does, but is counted only once copied.
        let room_for = match &payload {
            Payload::Lent(lent) => lent.bytes().len(),
            _ => copied,
        };
        let started = Instant::now();
        let mut payload = payload;
        loop {
            self.settle();
            let room = room_for == 0
                || self.copied.is_empty()
                || self.copied_bytes + room_for <= COPY_BUDGET;
            let conn = self.conn()?;
            if room {
                match conn.try_send(payload) {
                    Ok(_) => {
                        let index = self.queued;
                        self.queued += 1;
                        if copied > 0 {
                            self.copied.push_back((index, copied));
                            self.copied_bytes += copied;
                        }
                        self.conn()?.progress()?;
                        return Ok(Ok(index));
                    }
                    Err(SendError::QueueFull(back)) => payload = back,
                    Err(SendError::TooLong { len, max, .. }) => {
                        return Err(Failure::Io(IoError::TooLong { len, max }));
                    }
                    // Closed or closing: the link's own send names why.
                    Err(refused) => {
                        let why = conn.send(refused.into_buf(), Duration::ZERO).err();
                        return Err(Failure::Io(
                            why.unwrap_or(IoError::Closed(barlink::LinkError::LocalClose)),
                        ));
                    }
                }
            }
            let conn = self.conn()?;
            if !conn.progress()? {
                // A link that ended says so rather than wait for room.
                conn.check_open()?;
                std::thread::yield_now();
            }
            if started.elapsed() >= slice {
                return Ok(Err(payload));
            }
        }
    }
}

/// When a call gives up: `None` waits as long as it takes (the peer
/// timeout still ends the wait if the peer dies).
/// The clock is read only once a first wait came back empty: a call that
/// completes at once reads none.
#[derive(Clone, Copy)]
pub struct Deadline {
    at: Option<Instant>,
    timeout: Option<Duration>,
}

impl Deadline {
    pub fn new(timeout: Option<f64>) -> PyResult<Deadline> {
        let timeout = match timeout {
            None => None,
            Some(seconds) if seconds.is_finite() && seconds >= 0.0 => {
                Some(Duration::from_secs_f64(seconds.min(1e9)))
            }
            Some(seconds) => {
                return Err(PyValueError::new_err(format!(
                    "timeout must be None or a number of seconds >= 0, not {seconds}"
                )));
            }
        };
        Ok(Deadline { at: None, timeout })
    }

    /// How long the next wait may run.
    pub fn slice(&self) -> Duration {
        match (self.timeout, self.at) {
            (None, _) => SLICE,
            (Some(timeout), None) => timeout.min(SLICE),
            (Some(_), Some(at)) => at.saturating_duration_since(Instant::now()).min(SLICE),
        }
    }

    /// After a wait of `slice` came back empty: whether the time is up.
    pub fn passed(&mut self, slice: Duration) -> bool {
        let Some(timeout) = self.timeout else {
            return false;
        };
        let now = Instant::now();
        let at = *self.at.get_or_insert(now + timeout.saturating_sub(slice));
        now >= at
    }

    pub fn error(&self, what: &str) -> PyErr {
        let after = self.timeout.unwrap_or_default();
        PyTimeoutError::new_err(format!("{what}: timed out after {after:?}"))
    }
}

#[derive(Debug)]
pub struct Shared {
    state: Mutex<State>,
    /// Calls blocked on `state`'s lock: a waiting call lets them go first
    /// (the lock itself is not fair).
    queued: AtomicUsize,
    pub graveyard: Arc<Graveyard>,
    pub spares: Arc<Spares>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.try_lock() {
            Ok(guard) => return guard,
            Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {}
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        let guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.queued.fetch_sub(1, Ordering::Relaxed);
        guard
    }

    /// Between a waiting call's stretches under the lock: lets calls that
    /// queued for it meanwhile take it first.
    fn stand_aside(&self) {
        let started = Instant::now();
        std::thread::yield_now();
        while self.queued.load(Ordering::Relaxed) > 0 && started.elapsed() < STAND_ASIDE {
            std::thread::yield_now();
        }
    }

    /// Runs `step` without the GIL in slices until it returns a value, the
    /// deadline passes (`TimeoutError` naming `what`) or a signal handler
    /// raises. `step` is called again and again, with at most `HOLD` to
    /// wait each time (the last call of a slice with none), and other
    /// threads' calls on the link may run between two calls: what it keeps
    /// across calls must hold up to that.
    pub fn wait<T: Send>(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        what: &str,
        mut step: impl FnMut(&mut State, Duration) -> Result<Option<T>, Failure> + Send,
    ) -> PyResult<T> {
        let mut deadline = Deadline::new(timeout)?;
        loop {
            let slice = deadline.slice();
            // The slice in stretches of at most HOLD under the lock; the
            // clock is read once the first stretch came back empty.
            let result = crate::exit::detached(py, || {
                let mut started: Option<Instant> = None;
                loop {
                    let left = started.map_or(slice, |at| slice.saturating_sub(at.elapsed()));
                    let outcome = {
                        let mut state = self.lock();
                        self.spares.give_back(&mut state.conn);
                        step(&mut state, left.min(HOLD))
                    };
                    match outcome {
                        Ok(None) if !left.is_zero() => {
                            started.get_or_insert_with(Instant::now);
                            self.stand_aside();
                        }
                        outcome => break outcome,
                    }
                }
            });
            self.graveyard.release(py);
            match result {
                Ok(Some(value)) => return Ok(value),
                Ok(None) => {
                    py.check_signals()?;
                    if deadline.passed(slice) {
                        return Err(deadline.error(what));
                    }
                }
                Err(failure) => return Err(failure.into_py()),
            }
        }
    }

    /// The next delivered message if one is ready, wherever it landed
    /// (after one round of progress).
    pub fn next_delivery(state: &mut State) -> Result<Option<Delivery>, Failure> {
        if let Some(data) = state.pending.take() {
            return Ok(Some(Delivery::Message {
                id: MessageId(0),
                data,
            }));
        }
        Ok(state.conn()?.try_recv_delivery()?)
    }

    /// The next delivered message, wherever it landed, `None` past the
    /// slice.
    pub fn next_delivery_within(
        state: &mut State,
        slice: Duration,
    ) -> Result<Option<Delivery>, Failure> {
        if slice.is_zero() || state.pending.is_some() {
            return Shared::next_delivery(state);
        }
        match state.conn()?.recv_delivery(slice) {
            Ok(delivery) => Ok(Some(delivery)),
            Err(IoError::Timeout { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// The next message, `None` past the slice.
    pub fn next_message(state: &mut State, slice: Duration) -> Result<Option<Vec<u8>>, Failure> {
        if let Some(message) = state.pending.take() {
            return Ok(Some(message));
        }
        let conn = state.conn()?;
        let got = if slice.is_zero() {
            conn.try_recv()
        } else {
            conn.recv(slice).map(Some)
        };
        match got {
            Ok(message) => Ok(message),
            Err(IoError::Timeout { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }
}

/// A link to a peer over the path `connect` picked: messages of any size,
/// each delivered once, intact and in order, or an exception that says why
/// not. Safe to share between threads; blocking calls let other Python
/// threads run.
#[pyclass(module = "barlink", frozen)]
#[derive(Debug)]
pub struct Link {
    shared: Arc<Shared>,
    path: String,
    path_kind: &'static str,
    /// Writable messages of at least this many bytes are lent to the link
    /// for the `send` call rather than copied (`lend`).
    lend_from: usize,
}

impl Link {
    /// `max_payload_len`: the payload of one packet (the MTU less the
    /// header), which sets where sends lend rather than copy.
    pub fn new(conn: Connection<Payload>, max_payload_len: usize) -> Link {
        let path = conn.decision.to_string();
        let path_kind = conn.decision.path.as_str();
        Link {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    conn: Some(conn),
                    queued: 0,
                    pending: None,
                    copied: VecDeque::new(),
                    copied_bytes: 0,
                    loans: Vec::new(),
                    messages_copied: 0,
                    messages_lent: 0,
                }),
                queued: AtomicUsize::new(0),
                graveyard: Arc::new(Graveyard::default()),
                spares: Arc::new(Spares::default()),
            }),
            path,
            path_kind,
            lend_from: barlink::loan::lend_from(max_payload_len),
        }
    }

    /// Queues `payload` and drives the link until every packet of it
    /// went out at least once, so a caller that turns away from the link
    /// after `send` (to compute, or to wait on something else) leaves
    /// nothing behind that only its next call would move. It stops early
    /// while this side holds messages its caller has not received: the
    /// peer may be waiting in its own send for the credit they hold, and
    /// waiting here for its credit would be a deadlock.
    fn send_all(&self, py: Python<'_>, payload: Payload, timeout: Option<f64>) -> PyResult<()> {
        let mut payload = Some(payload);
        self.shared.wait(py, timeout, "send", |state, slice| {
            if let Some(message) = payload.take() {
                let copied = matches!(message, Payload::Copied(_));
                match state.queue(message, slice)? {
                    Ok(_) => state.messages_copied += u64::from(copied),
                    Err(back) => {
                        payload = Some(back);
                        return Ok(None);
                    }
                }
            }
            State::push_step(state, slice)
        })
    }

    fn held(&self, view: BufferView) -> Payload {
        Payload::Held(HeldView::new(view, self.shared.graveyard.clone()))
    }

    /// The link's state, shared with its requests.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// `recv_into` a large buffer: the buffer is lent to the link for the
    /// call, so the message lands in it with no copy after the checked one
    /// out of the medium; one that arrived elsewhere (it began before the
    /// call, or is larger) is taken back and copied, as for small buffers.
    fn recv_landing(
        &self,
        py: Python<'_>,
        view: BufferView,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        let capacity = view.len();
        let mut landing = LandingView::new(view, self.shared.clone());
        let mut lent = false;
        let delivery = self.shared.wait(py, timeout, "recv_into", |state, slice| {
            if !lent && state.pending.is_none() {
                landing.lend(state.conn()?, 0..capacity);
                lent = true;
            }
            // A message that landed in another call's lent buffer is read
            // out here, under the lock: that call may take its buffer back
            // and write it as soon as the lock is free.
            Ok(
                Shared::next_delivery_within(state, slice)?.map(|delivery| match delivery {
                    Delivery::Landed { id, recv, len } if !landing.holds(recv.id()) => {
                        let data = recv.into_target().bytes_mut()[..len].to_vec();
                        Delivery::Message { id, data }
                    }
                    delivery => delivery,
                }),
            )
        });
        let delivery = match delivery {
            Ok(delivery) => delivery,
            Err(error) => {
                landing.take_back_all(self.shared.lock().conn.as_mut());
                return Err(error);
            }
        };
        if let Delivery::Landed { recv, len, .. } = &delivery
            && landing.landed(recv.id()).is_some()
        {
            return Ok(*len);
        }
        landing.take_back_all(self.shared.lock().conn.as_mut());
        let message = match delivery {
            Delivery::Message { data, .. } => data,
            // Landed in this call's buffer, but not as its lent range.
            Delivery::Landed { recv, len, .. } => recv.into_target().bytes_mut()[..len].to_vec(),
        };
        let len = message.len();
        if len > capacity {
            self.shared.lock().pending = Some(message);
            return Err(PyValueError::new_err(format!(
                "the next message has {len} bytes and the buffer {capacity}: it stays first \
                 in line; receive it with a buffer of at least {len} bytes"
            )));
        }
        crate::exit::detached(py, || landing.range_mut(0..len).copy_from_slice(&message));
        self.shared.spares.keep(message);
        Ok(len)
    }
}

#[pymethods]
impl Link {
    /// The path and why it was picked, e.g. "host-bounce: ...".
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// The path alone: "host-bounce", "bar-p2p", "rdma" or "tcp".
    #[getter]
    fn path_kind(&self) -> &'static str {
        self.path_kind
    }

    /// Sends the bytes of `buf` (any object with the buffer protocol) as
    /// one message, and returns once every packet of it went out (as
    /// `socket.sendall` does; `flush` waits for the acknowledgement).
    /// Large read-only buffers (bytes) are read in place and held until
    /// the peer acknowledges them. A writable buffer is the caller's again
    /// when this returns: one of four packets' payload or more (just under
    /// 512 KiB at the default MTU) is read in place while the call waits
    /// for the acknowledgement, and copied if the call returns first (the
    /// message stopped moving for about as long as a copy takes, moves
    /// slower than 1 GB/s, this side holds messages not yet received, or
    /// the timeout ran out); shorter ones are copied at once. Waits at
    /// most `timeout` seconds.
    #[pyo3(signature = (buf, timeout=None))]
    fn send(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let view = BufferView::get(buf, false)?;
        let payload = if view.len() <= HOLD_FROM {
            Payload::Copied(view.bytes().to_vec())
        } else if view.is_readonly() {
            self.held(view)
        } else if view.len() >= self.lend_from && !SendMemory::overlaps(view.bytes()) {
            // Bytes in send memory an RDMA link may read in place after
            // the acknowledgement (a resend still queued): those are not
            // lent for a call.
            return lend::send_lent(&self.shared, py, view, timeout);
        } else if view.len() <= COPY_WITH_GIL_UP_TO {
            Payload::Copied(view.bytes().to_vec())
        } else {
            Payload::Copied(crate::exit::detached(py, || view.bytes().to_vec()))
        };
        self.send_all(py, payload, timeout)
    }

    /// Queues the bytes of `buf` as one message without copying them and
    /// returns a Request that completes when the peer acknowledged it.
    /// `buf` must not change until then. Raises BlockingIOError when the
    /// send queue is full.
    fn post_send(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<Request> {
        let view = BufferView::get(buf, false)?;
        let payload = self.held(view);
        let mut payload = Some(payload);
        let index = self.shared.wait(py, Some(0.0), "post_send", |state, _| {
            let message = payload.take().expect("one attempt");
            match state.queue(message, Duration::ZERO)? {
                Ok(index) => Ok(Some(index)),
                Err(_) => Err(Failure::Busy),
            }
        })?;
        Ok(Request {
            shared: self.shared.clone(),
            index,
        })
    }

    /// The next message as bytes, waiting at most `timeout` seconds (None:
    /// until one comes or the link ends; 0: only what has arrived). With
    /// `copy=False`, a read-only Message that exposes the received memory
    /// through the buffer protocol, without a copy.
    #[pyo3(signature = (timeout=None, copy=true))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>, copy: bool) -> PyResult<Py<PyAny>> {
        let message = self
            .shared
            .wait(py, timeout, "recv", Shared::next_message)?;
        if !copy {
            return Ok(Message::new(message, self.shared.spares.clone())
                .into_pyobject(py)?
                .into_any()
                .unbind());
        }
        let bytes = buffer::bytes_from(py, &message, COPY_WITH_GIL_UP_TO + 1)?;
        self.shared.spares.keep(message);
        Ok(bytes.into_any().unbind())
    }

    /// Receives the next message into `buf` (a writable buffer: bytearray,
    /// numpy array) and returns its length. A message longer than `buf`
    /// raises ValueError and stays first in line. A buffer over 64 KiB is
    /// lent to the link for the call, so the message lands in it directly;
    /// after an exception its contents are unspecified.
    #[pyo3(signature = (buf, timeout=None))]
    fn recv_into(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        let mut view = BufferView::get(buf, true)?;
        let capacity = view.len();
        if capacity > COPY_WITH_GIL_UP_TO {
            return self.recv_landing(py, view, timeout);
        }
        let message = self
            .shared
            .wait(py, timeout, "recv_into", Shared::next_message)?;
        if message.len() > capacity {
            let len = message.len();
            self.shared.lock().pending = Some(message);
            return Err(PyValueError::new_err(format!(
                "the next message has {len} bytes and the buffer {capacity}: it stays first \
                 in line; receive it with a buffer of at least {len} bytes"
            )));
        }
        if message.len() <= COPY_WITH_GIL_UP_TO {
            view.write_prefix(&message);
        } else {
            crate::exit::detached(py, || view.write_prefix(&message));
        }
        let len = message.len();
        self.shared.spares.keep(message);
        Ok(len)
    }

    /// Waits until every message sent so far is acknowledged by the peer.
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.shared.wait(py, timeout, "flush", |state, slice| {
            match state.conn()?.flush(slice) {
                Ok(()) => Ok(Some(())),
                Err(IoError::Timeout { .. }) => Ok(None),
                Err(error) => Err(error.into()),
            }
        })
    }

    /// Drives the link once (sends what is queued, takes what arrived);
    /// whether anything moved. Only needed by a caller that neither sends
    /// nor receives on this link for a while (it computes, or waits on
    /// other links): the peer hears nothing from a link nobody drives, and
    /// takes it for lost after its peer timeout. Raises why the link
    /// ended (`PeerLost`, `LinkClosed`, ...) once it has, and nothing is
    /// left to receive.
    fn progress(&self, py: Python<'_>) -> PyResult<bool> {
        self.shared.wait(py, Some(0.0), "progress", |state, _| {
            // A message too large for a recv_into waits here, unreceived.
            let parked = state.pending.is_some();
            let conn = state.conn()?;
            let moved = conn.progress()?;
            // A loss or a close is recorded, not returned, by a round of
            // progress: ask, once the messages that arrived are taken.
            if !moved && !parked && !conn.holds_unreceived() {
                conn.check_open()?;
            }
            Ok(Some(moved))
        })
    }

    /// Closes in order: messages already sent are still delivered and the
    /// peer is told, for at most `timeout` seconds. Calls afterwards raise
    /// LinkClosed; closing again does nothing.
    #[pyo3(signature = (timeout=5.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let deadline = Deadline::new(Some(timeout))?;
        let conn = {
            let mut state = self.shared.lock();
            // The close below drives the link without the lock, so buffers
            // lent to it (recv_into, an Exchange) come back first: their
            // owners, on other threads, may release them at once.
            if let Some(conn) = state.conn.as_mut() {
                drop(conn.unpost_all());
            }
            // So does every buffer a send on another thread lent it: the
            // close reads a copy of it.
            for loan in std::mem::take(&mut state.loans) {
                if let Some(loan) = loan.upgrade() {
                    loan.back_up();
                }
            }
            state.conn.take()
        };
        let Some(mut conn) = conn else {
            return Ok(());
        };
        let limit = deadline.timeout.unwrap_or_default();
        let result = crate::exit::detached(py, move || {
            let result = conn.close(limit);
            drop(conn);
            result
        });
        self.shared.graveyard.release(py);
        match result {
            Ok(()) | Err(IoError::Closed(_)) => Ok(()),
            Err(error) => Err(errors::io_error(error)),
        }
    }

    /// Whether close() was called.
    #[getter]
    fn closed(&self) -> bool {
        self.shared.lock().conn.is_none()
    }

    /// The engine's counters (packets, bytes, retransmissions, CRC
    /// failures, ...) as a dict, and how `send` took its messages
    /// (`messages_lent`, `messages_copied`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (stats, copied, lent) = {
            let mut state = self.shared.lock();
            let stats = state.conn.as_mut().map(Connection::stats);
            (stats, state.messages_copied, state.messages_lent)
        };
        let stats = stats.ok_or_else(closed_here)?;
        let dict = PyDict::new(py);
        for (name, value) in stats.fields() {
            dict.set_item(name, value)?;
        }
        dict.set_item("messages_copied", copied)?;
        dict.set_item("messages_lent", lent)?;
        Ok(dict)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py, 5.0)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "open" };
        format!("<barlink.Link {} ({state})>", self.path_kind)
    }
}

/// A posted send: complete when the peer acknowledged the message.
#[pyclass(module = "barlink", frozen)]
#[derive(Debug)]
pub struct Request {
    shared: Arc<Shared>,
    index: u64,
}

impl Request {
    fn check(&self, state: &mut State) -> Result<bool, Failure> {
        let conn = state.conn()?;
        if conn.completed() > self.index {
            return Ok(true);
        }
        conn.progress()?;
        if conn.completed() > self.index {
            return Ok(true);
        }
        conn.check_open()?;
        Ok(false)
    }
}

#[pymethods]
impl Request {
    /// Whether the peer acknowledged the message (drives the link once).
    /// Raises why if the link ended before it did.
    fn test(&self, py: Python<'_>) -> PyResult<bool> {
        self.shared.wait(py, Some(0.0), "test", |state, _| {
            Ok(Some(self.check(state)?))
        })
    }

    /// Waits at most `timeout` seconds for the peer to acknowledge it.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.shared.wait(py, timeout, "wait", |state, slice| {
            let started = Instant::now();
            loop {
                if self.check(state)? {
                    return Ok(Some(()));
                }
                if started.elapsed() >= slice {
                    return Ok(None);
                }
                std::thread::yield_now();
            }
        })
    }

    fn __repr__(&self) -> String {
        format!("<barlink.Request message {}>", self.index)
    }
}
