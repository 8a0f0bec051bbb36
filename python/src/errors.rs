//! barlink's errors as Python exceptions that carry its reason.
#![forbid(unsafe_code)]

use barlink::ConnectError;
use barlink::LinkError;
use barlink_transport::link::IoError;
use pyo3::create_exception;
use pyo3::exceptions::{PyConnectionError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;

create_exception!(
    barlink,
    SetupError,
    PyConnectionError,
    "No link could be set up: no path reaches the peer, the peer refused this side, \
     or setup timed out. The message says what was tried and what to check."
);
create_exception!(
    barlink,
    LinkFailed,
    PyConnectionError,
    "The link ended and cannot carry more messages: the medium failed, a packet could \
     not get through, or the peer broke the protocol. Messages it delivered before were \
     intact; the message says why it ended."
);
create_exception!(
    barlink,
    PeerLost,
    LinkFailed,
    "The peer went silent for the link's peer timeout (its process died, or the path \
     stopped delivering), or it restarted and the old session is gone."
);
create_exception!(
    barlink,
    LinkClosed,
    LinkFailed,
    "The link was closed in order, by this side or by the peer: every message sent \
     before the close was delivered."
);

create_exception!(
    barlink,
    Mismatch,
    PyValueError,
    "A collective's ranks disagree: a peer called another operation, or gave a tensor \
     of another shape or dtype. Nothing was combined with its data; the group's links \
     are out of step afterwards."
);

/// An exception to raise: its type and text, made into a Python exception
/// anew for each raise. Making one runs no Python code until it is raised,
/// so it may be made and kept under a lock (`collective::Exchange`).
#[derive(Debug, Clone)]
pub struct Raisable {
    new_err: fn(String) -> PyErr,
    text: String,
}

impl Raisable {
    pub fn new(new_err: fn(String) -> PyErr, text: impl Into<String>) -> Self {
        Raisable {
            new_err,
            text: text.into(),
        }
    }

    pub fn raise(&self) -> PyErr {
        (self.new_err)(self.text.clone())
    }
}

/// The exception for a failed link call.
pub fn io_error(error: IoError) -> PyErr {
    io_raisable(error).raise()
}

/// [`io_error`], to raise later.
pub fn io_raisable(error: IoError) -> Raisable {
    let text = error.to_string();
    let new_err: fn(String) -> PyErr = match error {
        IoError::Timeout { .. } => PyTimeoutError::new_err,
        IoError::TooLong { .. } => PyValueError::new_err,
        IoError::Closed(LinkError::PeerLost { .. } | LinkError::PeerRestarted { .. }) => {
            PeerLost::new_err
        }
        IoError::Closed(LinkError::PeerClosed | LinkError::LocalClose) => LinkClosed::new_err,
        _ => LinkFailed::new_err,
    };
    Raisable::new(new_err, text)
}

/// The exception for a failed `connect`.
pub fn connect_error(error: ConnectError) -> PyErr {
    match error {
        ConnectError::Usage { detail } => PyValueError::new_err(detail),
        other => SetupError::new_err(other.to_string()),
    }
}

/// The exception for a call on a link that was closed by `close()`.
pub fn closed_here() -> PyErr {
    closed_here_raisable().raise()
}

/// [`closed_here`], to raise later.
pub fn closed_here_raisable() -> Raisable {
    Raisable::new(LinkClosed::new_err, "link closed: this side called close()")
}
