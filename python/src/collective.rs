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

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use barlink::Connection;
use barlink_transport::{Delivery, PostId};

use crate::buffer::{BufferView, LandingView};
use crate::link::{Deadline, Failure, HeldView, Link, Payload, Shared};
use crate::reduce::{self, Dtype, Op};

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
}

impl Sending {
    /// Queues what there is room for and drives the link once: whether
    /// all of it is acknowledged, and whether anything moved.
    fn step(&mut self) -> Result<(bool, bool), Failure> {
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
        let queued = self.tag.is_none() && self.next >= self.len;
        let acknowledged = self.last.is_none_or(|last| conn.completed() > last);
        if !acknowledged {
            conn.check_open()?;
        }
        Ok((queued && acknowledged, moved))
    }
}

/// Chunks lent to the link ahead of their arrival, at most: enough that
/// the chunks a round of progress brings in find their place posted.
const LENT_AHEAD: usize = 8;

/// The receiving half: the tag the peer must send first, then chunks
/// landed, copied or combined into the buffer.
///
/// Chunks to be copied (no reduction) are lent to the link as receive
/// targets before they arrive, so they land in the buffer with no copy
/// after the checked one out of the medium; the tag gets a target of its
/// own, first. A message that arrives anywhere else (it began before its
/// target was posted) is copied, after every lent range is taken back, and
/// lending starts again after it.
#[derive(Debug)]
struct Receiving {
    shared: Arc<Shared>,
    view: LandingView,
    chunk: usize,
    tag: Option<Vec<u8>>,
    /// The tag's own target, while lent.
    tag_post: Option<PostId>,
    /// Bytes of the buffer written so far.
    done: usize,
    /// Bytes of the buffer lent so far (`done` and beyond).
    lent_to: usize,
    reduce: Option<(Dtype, Op)>,
}

/// Where a delivered message is, for the receiving half.
enum Arrived {
    /// In the range of the buffer it was lent for.
    InPlace(std::ops::Range<usize>),
    /// In the tag's own target, this long.
    Tag(Vec<u8>),
    /// Anywhere else: its bytes.
    Elsewhere(Vec<u8>),
}

impl Receiving {
    /// Lends the tag's target and the coming chunks' ranges, where the
    /// chunks are copied, not combined.
    fn lend_ahead(&mut self, conn: &mut Connection<Payload>) {
        if self.reduce.is_some() {
            return;
        }
        if let Some(tag) = &self.tag
            && self.tag_post.is_none()
            && self.view.lent() == 0
        {
            self.tag_post = Some(conn.post_recv(Box::new(vec![0u8; tag.len()])));
        }
        let len = self.view.len();
        self.lent_to = self.lent_to.max(self.done);
        while self.view.lent() < LENT_AHEAD && self.lent_to < len {
            let end = (self.lent_to + self.chunk).min(len);
            self.view.lend(conn, self.lent_to..end);
            self.lent_to = end;
        }
    }

    /// Takes back every target lent; lending starts again from `done`.
    fn take_back(&mut self, conn: Option<&mut Connection<Payload>>) {
        match conn {
            Some(conn) => {
                if let Some(id) = self.tag_post.take() {
                    let _ = conn.unpost_recv(id);
                }
                self.view.take_back_all(Some(conn));
            }
            None => {
                self.tag_post = None;
                self.view.take_back_all(None);
            }
        }
        self.lent_to = self.done;
    }

    /// Where `delivery` is; anything but the target lent first means the
    /// lent targets are out of step with the messages: all are taken back.
    fn arrived(&mut self, delivery: Delivery, conn: &mut Connection<Payload>) -> Arrived {
        match delivery {
            Delivery::Landed { recv, len, .. } => {
                let id = recv.id();
                if self.tag_post == Some(id) {
                    self.tag_post = None;
                    let mut target = recv.into_target();
                    return Arrived::Tag(target.bytes_mut()[..len].to_vec());
                }
                if self.tag_post.is_none()
                    && let Some(range) = self.view.landed(id)
                {
                    return Arrived::InPlace(range.start..range.start + len);
                }
                // Never expected (targets go in the order posted); read it
                // into memory of its own before the view is written.
                let bytes = recv.into_target().bytes_mut()[..len].to_vec();
                self.take_back(Some(conn));
                Arrived::Elsewhere(bytes)
            }
            Delivery::Message { data, .. } => {
                self.take_back(Some(conn));
                Arrived::Elsewhere(data)
            }
        }
    }

    /// Takes every message that arrived: whether the buffer is complete,
    /// and whether anything moved.
    fn step(&mut self) -> Result<(bool, bool), Failure> {
        let shared = Arc::clone(&self.shared);
        let mut state = shared.lock();
        shared.spares.give_back(&mut state.conn);
        let mut moved = false;
        let len = self.view.len();
        loop {
            let complete = self.tag.is_none() && self.done >= len;
            let delivery = if complete {
                None
            } else {
                if let Some(conn) = state.conn.as_mut() {
                    self.lend_ahead(conn);
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
            let arrived = self.arrived(delivery, state.conn()?);
            if let Some(want) = self.tag.take() {
                let message = match arrived {
                    Arrived::Tag(bytes) | Arrived::Elsewhere(bytes) => bytes,
                    Arrived::InPlace(range) => {
                        // A chunk's target took it: the tag's did not come
                        // first, so the peer sent no tag of this length.
                        self.take_back(state.conn.as_mut());
                        self.view.bytes_mut()[range].to_vec()
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
                Arrived::Tag(bytes) | Arrived::Elsewhere(bytes) => bytes.len(),
            };
            if got != want {
                return Err(Failure::Mismatch(format!(
                    "the peer sent a chunk of {got} bytes where this rank expected {want} (at byte \
                     {} of {len}): the ranks' tensors differ in size",
                    self.done
                )));
            }
            match arrived {
                Arrived::InPlace(range) => debug_assert_eq!(range.start, self.done),
                Arrived::Tag(message) | Arrived::Elsewhere(message) => {
                    let target = &mut self.view.bytes_mut()[self.done..self.done + want];
                    match self.reduce {
                        None => target.copy_from_slice(&message),
                        Some((dtype, op)) => reduce::combine(target, &message, dtype, op)
                            .map_err(|e| Failure::Mismatch(e.to_string()))?,
                    }
                    self.shared.spares.keep(message);
                }
            }
            self.done += want;
        }
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        // The tag's target is a Vec of its own; the view takes its lent
        // ranges back itself. Taking the tag's back too keeps the link's
        // next receive from landing in it.
        if let Some(id) = self.tag_post.take() {
            let mut state = self.shared.lock();
            if let Some(conn) = state.conn.as_mut() {
                let _ = conn.unpost_recv(id);
            }
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

/// A send and a receive in progress (see `Exchange.__new__`).
#[derive(Debug)]
struct Halves {
    sending: Option<Sending>,
    receiving: Option<Receiving>,
}

impl Halves {
    /// Steps both halves until both are done (true) or `slice` passed.
    fn drive(&mut self, slice: Duration) -> Result<bool, Failure> {
        let started = Instant::now();
        loop {
            // Receiving first: it lends the buffer to the link before the
            // sending half's progress can bring the first chunks in.
            let (received, recv_moved) = match &mut self.receiving {
                Some(r) => r.step()?,
                None => (true, false),
            };
            let (sent, send_moved) = match &mut self.sending {
                Some(s) => s.step()?,
                None => (true, false),
            };
            if sent && received {
                return Ok(true);
            }
            if started.elapsed() >= slice {
                return Ok(false);
            }
            if !send_moved && !recv_moved {
                std::thread::yield_now();
            }
        }
    }

    fn release(&self, py: Python<'_>) {
        let sending = self.sending.iter().map(|s| &s.shared);
        for shared in sending.chain(self.receiving.iter().map(|r| &r.shared)) {
            shared.graveyard.release(py);
        }
    }
}

#[derive(Debug)]
enum Progress {
    Running(Box<Halves>),
    Done,
    Failed(PyErr),
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
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drives the exchange for at most `slice` without the GIL: whether it
    /// is done.
    fn run(&self, py: Python<'_>, slice: Duration) -> PyResult<bool> {
        let mut progress = self.lock();
        let outcome = match &mut *progress {
            Progress::Done => return Ok(true),
            Progress::Failed(error) => return Err(error.clone_ref(py)),
            Progress::Running(halves) => {
                let outcome = py.detach(|| halves.drive(slice));
                halves.release(py);
                outcome
            }
        };
        match outcome {
            Ok(true) => {
                *progress = Progress::Done;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(failure) => {
                let error = failure.into_py();
                *progress = Progress::Failed(error.clone_ref(py));
                Err(error)
            }
        }
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
        let reduce = match reduce {
            None => None,
            Some((op, dtype)) => Some((parse_dtype(&dtype)?, parse_op(&op)?)),
        };
        let element = reduce.map_or(1, |(dtype, _)| dtype.size());
        if chunk == 0 || !chunk.is_multiple_of(element) {
            return Err(PyValueError::new_err(format!(
                "chunk must be a positive multiple of the element size {element}, not {chunk}"
            )));
        }
        let sending = both("send", send_to, send_buf)?
            .map(|(link, buf)| -> PyResult<Sending> {
                let view = BufferView::get(buf, false)?;
                let shared = link.shared().clone();
                Ok(Sending {
                    len: view.len(),
                    held: Arc::new(HeldView::new(view, shared.graveyard.clone())),
                    shared,
                    chunk,
                    tag: tag.clone(),
                    next: 0,
                    last: None,
                })
            })
            .transpose()?;
        let receiving = both("recv", recv_from, recv_buf)?
            .map(|(link, buf)| -> PyResult<Receiving> {
                let view = BufferView::get(buf, true)?;
                if !view.len().is_multiple_of(element) {
                    return Err(PyValueError::new_err(format!(
                        "recv_buf has {} bytes, not a whole number of {element}-byte elements",
                        view.len()
                    )));
                }
                let shared = link.shared().clone();
                Ok(Receiving {
                    view: LandingView::new(view, shared.clone()),
                    shared,
                    chunk,
                    tag: tag.clone(),
                    tag_post: None,
                    done: 0,
                    lent_to: 0,
                    reduce,
                })
            })
            .transpose()?;
        if let (Some(s), Some(r)) = (&sending, &receiving) {
            let (a, b) = (s.held.span(), r.view.span());
            if a.start < b.end && b.start < a.end {
                return Err(PyValueError::new_err(
                    "send_buf and recv_buf overlap: the received bytes would change what is \
                     being sent",
                ));
            }
        }
        let halves = Halves { sending, receiving };
        Ok(Exchange {
            progress: Mutex::new(Progress::Running(Box::new(halves))),
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
            py.check_signals()?;
            if deadline.passed(slice) {
                return Err(deadline.error("exchange"));
            }
        }
    }

    /// Whether it completed.
    #[getter]
    fn done(&self) -> bool {
        matches!(*self.lock(), Progress::Done)
    }
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
    if a.start < b.end && b.start < a.end && a != b {
        return Err(PyValueError::new_err(
            "dst and src overlap without being the same memory",
        ));
    }
    if a == b && !a.is_empty() {
        // The same memory on both sides: combine with a copy of it.
        let copy = source.bytes().to_vec();
        return py
            .detach(|| reduce::combine(target.bytes_mut(), &copy, parsed_dtype, parsed_op))
            .map_err(|e| PyValueError::new_err(e.to_string()));
    }
    py.detach(|| reduce::combine(target.bytes_mut(), source.bytes(), parsed_dtype, parsed_op))
        .map_err(|e| PyValueError::new_err(e.to_string()))
}
