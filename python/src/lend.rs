//! A long `Link.send` of a writable buffer reads it in place: the bytes
//! are lent to the link for the length of the call, which drives the link
//! until the peer acknowledges the message, and copies them only if the
//! call must return first (the message stopped moving, a peer slow to
//! answer or not reading now; see `lend_and_wait`), so that the caller
//! may change its buffer as soon as `send` returns. When to lend, and
//! when to stop waiting and copy, is the C face's rule (`barlink::loan`).
//!
//! The one `unsafe` here lends the view's memory to the link: `Settle`
//! keeps the view held until the link no longer reads it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use barlink::loan::LoanWait;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;

use crate::buffer::{BufferView, SendLoan};
use crate::link::{Deadline, HeldView, Payload, Shared, State};

/// The call's hold on its lent bytes, settled before it returns: on every
/// way out (an exception, a timeout, a panic) the bytes are copied if the
/// link still holds them, and then the view is let go.
struct Settle<'a> {
    shared: &'a Shared,
    loan: Option<Arc<SendLoan>>,
    /// The view the loan reads; released once the loan no longer does.
    view: Option<HeldView>,
    /// The message's index, once queued.
    index: Option<u64>,
    /// Whether the bytes were copied when the call settled.
    copied: bool,
    /// Whether the peer had acknowledged the message when it settled.
    acknowledged: bool,
}

impl Settle<'_> {
    /// Copies the bytes in their place if the link still holds them (the
    /// copy then counts against the link's budget of copies until the
    /// peer acknowledges it), then lets the view go.
    fn settle(&mut self) {
        let Some(loan) = self.loan.take() else {
            return;
        };
        // Counts above one: the link's payload still holds the bytes. The
        // copy is made before the lock is taken, so that a long one does
        // not hold up the link's other callers: the view is still held,
        // and the link reading the same bytes meanwhile is harmless.
        let copy = (Arc::strong_count(&loan) > 1).then(|| loan.bytes().to_vec());
        // The link reads its payloads under the lock (the contract of
        // `lend_to_send`): from here until the view goes, it reads none.
        let mut state = self.shared.lock();
        state.forget_loan(&loan);
        if let Some(index) = self.index {
            self.acknowledged |= state
                .conn
                .as_mut()
                .is_some_and(|conn| conn.completed() > index);
        }
        if Arc::strong_count(&loan) > 1 {
            let copy = copy.unwrap_or_else(|| loan.bytes().to_vec());
            let len = copy.len();
            // Not if `close` backed it up already.
            if loan.back_up_with(copy)
                && let Some(index) = self.index
            {
                state.hold_copy(index, len);
            }
        }
        // Copied here or by `close`: the link reads a copy.
        self.copied = loan.is_backed_up();
        if self.copied && self.index.is_some() {
            state.messages_copied += 1;
        }
        drop(loan);
        // Buried, to be released with the GIL.
        drop(self.view.take());
    }
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        self.settle();
    }
}

/// `Link.send` of a writable `view` of at least
/// [`barlink::loan::LOAN_FROM_PACKETS`] packets: queues it lent, drives
/// the link until the peer acknowledges it or it stops moving, then
/// returns with the caller's memory free.
pub fn send_lent(
    shared: &Shared,
    py: Python<'_>,
    view: BufferView,
    timeout: Option<f64>,
) -> PyResult<()> {
    #[allow(unsafe_code)]
    // SAFETY: `settle` keeps the view held until the link let go of the
    // loan or the loan backed up, under the link's lock, which the link
    // reads its payloads under (`Link.close`, which drives the link
    // without it, backs every loan up first); `settle` runs before this
    // returns or unwinds.
    let loan = Arc::new(unsafe { view.lend_to_send() });
    let started = Instant::now();
    let mut settle = Settle {
        shared,
        loan: Some(Arc::clone(&loan)),
        view: Some(HeldView::new(view, shared.graveyard.clone())),
        index: None,
        copied: false,
        acknowledged: false,
    };
    let waited = lend_and_wait(shared, py, loan, timeout, started, &mut settle.index);
    settle.acknowledged = matches!(waited, Ok(true));
    crate::exit::detached(py, || settle.settle());
    // The view goes back to Python before the call returns, whatever
    // happened, so that the caller may resize or free its buffer.
    shared.graveyard.release(py);
    let sent = match waited {
        Ok(true) => Ok(()),
        // Copied, or out of time waiting for the acknowledgement: from
        // here on this is a copying send, which returns once every packet
        // went out.
        Ok(false) => shared
            .wait(py, left(timeout, started), "send", State::push_step)
            .map_err(|error| whole_timeout(py, error, timeout)),
        Err(error) if settle.index.is_some() && error.is_instance_of::<PyTimeoutError>(py) => {
            match State::push_step(&mut shared.lock(), Duration::ZERO) {
                Ok(Some(())) => Ok(()),
                Ok(None) => Err(whole_timeout(py, error, timeout)),
                Err(failure) => Err(failure.into_py()),
            }
        }
        Err(error) => Err(error),
    };
    if sent.is_ok() && settle.acknowledged && !settle.copied {
        shared.lock().messages_lent += 1;
    }
    sent
}

/// Queues the lent message (once the copies held leave room for one more
/// of its size, which it may become: `State::queue`), and drives the link
/// until the peer
/// acknowledges it (`true`) or the call should copy it and return
/// (`false`): it has not moved for about as long as a copy would take,
/// it moves slower than a byte a nanosecond, or this side holds messages
/// its caller has not received (the peer may be waiting in its own send
/// for the credit they take). `index` gets the message's index once it
/// is queued.
fn lend_and_wait(
    shared: &Shared,
    py: Python<'_>,
    loan: Arc<SendLoan>,
    timeout: Option<f64>,
    started: Instant,
    index: &mut Option<u64>,
) -> PyResult<bool> {
    let len = loan.bytes().len();
    let mut weak = Some(Arc::downgrade(&loan));
    let mut payload = Some(Payload::Lent(loan));
    let queued = shared.wait(py, timeout, "send", |state, slice| {
        let Some(message) = payload.take() else {
            return Ok(None);
        };
        // Noted before it is queued: `queue` may fail after the link took
        // it (a failed round), and `close` must find every loan the link
        // may hold.
        if let Some(loan) = weak.take() {
            state.lend(loan);
        }
        match state.queue(message, slice)? {
            Ok(queued) => Ok(Some(queued)),
            Err(back) => {
                payload = Some(back);
                Ok(None)
            }
        }
    });
    // Not queued: nothing of it is held but by the call.
    drop(payload);
    let queued = queued?;
    *index = Some(queued);
    let mut wait = LoanWait::new(len, started);
    shared.wait(py, left(timeout, started), "send", |state, slice| {
        let conn = state.conn()?;
        let stretch = Instant::now();
        loop {
            if conn.completed() > queued {
                return Ok(Some(true));
            }
            let moved = conn.progress()?;
            if conn.completed() > queued {
                return Ok(Some(true));
            }
            if conn.holds_unreceived() {
                return Ok(Some(false));
            }
            let now = Instant::now();
            if wait.should_copy(conn.engine_stats(), now) {
                return Ok(Some(false));
            }
            if now - stretch >= slice {
                return Ok(None);
            }
            if !moved {
                // A link that ended (a lost peer) says so here, rather
                // than after the wait went quiet.
                conn.check_open()?;
                std::thread::yield_now();
            }
        }
    })
}

/// A wait's `TimeoutError`, naming the call's whole `timeout` rather than
/// what was left of it for that wait.
fn whole_timeout(py: Python<'_>, error: PyErr, timeout: Option<f64>) -> PyErr {
    if !error.is_instance_of::<PyTimeoutError>(py) {
        return error;
    }
    Deadline::new(timeout).map_or(error, |deadline| deadline.error("send"))
}

/// What is left of a call's `timeout` (seconds, `None` for none) that
/// began at `started`.
fn left(timeout: Option<f64>, started: Instant) -> Option<f64> {
    timeout.map(|seconds| (seconds - started.elapsed().as_secs_f64()).max(0.0))
}
