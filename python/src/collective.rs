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

use crate::buffer::BufferView;
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

/// The receiving half: the tag the peer must send first, then chunks
/// copied or combined into the buffer.
#[derive(Debug)]
struct Receiving {
    shared: Arc<Shared>,
    view: BufferView,
    chunk: usize,
    tag: Option<Vec<u8>>,
    /// Bytes of the buffer written so far.
    done: usize,
    reduce: Option<(Dtype, Op)>,
}

impl Receiving {
    /// Takes every message that arrived: whether the buffer is complete,
    /// and whether anything moved.
    fn step(&mut self) -> Result<(bool, bool), Failure> {
        let mut state = self.shared.lock();
        self.shared.spares.give_back(&mut state.conn);
        let mut moved = false;
        let len = self.view.len();
        loop {
            let complete = self.tag.is_none() && self.done >= len;
            let message = if complete {
                None
            } else {
                Shared::next_message(&mut state, Duration::ZERO)?
            };
            let Some(message) = message else {
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
            if let Some(want) = self.tag.take() {
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
            if message.len() != want {
                return Err(Failure::Mismatch(format!(
                    "the peer sent a chunk of {} bytes where this rank expected {want} (at byte \
                     {} of {len}): the ranks' tensors differ in size",
                    message.len(),
                    self.done
                )));
            }
            let target = &mut self.view.bytes_mut()[self.done..self.done + want];
            match self.reduce {
                None => target.copy_from_slice(&message),
                Some((dtype, op)) => reduce::combine(target, &message, dtype, op)
                    .map_err(|e| Failure::Mismatch(e.to_string()))?,
            }
            self.done += want;
            self.shared.spares.keep(message);
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
            let (sent, send_moved) = match &mut self.sending {
                Some(s) => s.step()?,
                None => (true, false),
            };
            let (received, recv_moved) = match &mut self.receiving {
                Some(r) => r.step()?,
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
                Ok(Receiving {
                    shared: link.shared().clone(),
                    view,
                    chunk,
                    tag: tag.clone(),
                    done: 0,
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
