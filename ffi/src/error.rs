//! Errors at the boundary: a status code for the caller, a message in a
//! thread-local for `barlink_last_error`, and the wrapper that keeps panics
//! on this side of it.
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::types::barlink_status::{self, *};

/// A failed call: the code returned, the message kept for the thread.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) status: barlink_status,
    message: Message,
    /// For `BARLINK_BUFFER_TOO_SMALL`: the size that would do.
    pub(crate) needed: Option<usize>,
}

#[derive(Debug)]
enum Message {
    /// Hot paths (a request still pending, a full queue) allocate nothing.
    Static(&'static CStr),
    Owned(Cow<'static, str>),
    /// A blocking call's wait ran out: no text is made unless asked for
    /// (`barlink_last_error`), as a caller polling with a timeout of 0
    /// gets this on every call that finds nothing.
    TimedOut {
        after_ms: u128,
    },
}

impl Error {
    pub(crate) fn new(status: barlink_status, message: impl Into<Cow<'static, str>>) -> Self {
        Error {
            status,
            message: Message::Owned(message.into()),
            needed: None,
        }
    }

    pub(crate) fn fixed(status: barlink_status, message: &'static CStr) -> Self {
        Error {
            status,
            message: Message::Static(message),
            needed: None,
        }
    }

    /// `BARLINK_TIMEOUT` after waiting `after_ms`: "timed out after N ms".
    pub(crate) fn timed_out(after_ms: u128) -> Self {
        Error {
            status: BARLINK_TIMEOUT,
            message: Message::TimedOut { after_ms },
            needed: None,
        }
    }

    pub(crate) fn with_needed(mut self, needed: usize) -> Self {
        self.needed = Some(needed);
        self
    }

    pub(crate) fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(BARLINK_INVALID_ARGUMENT, message)
    }

    /// The message, for tests.
    #[cfg(test)]
    pub(crate) fn text(&self) -> String {
        match &self.message {
            Message::Static(text) => text.to_string_lossy().into_owned(),
            Message::Owned(text) => text.to_string(),
            Message::TimedOut { after_ms } => format!("timed out after {after_ms} ms"),
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

enum LastError {
    None,
    Static(&'static CStr),
    Owned(CString),
    /// Made into text when first read.
    TimedOut {
        function: &'static str,
        after_ms: u128,
    },
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = const { RefCell::new(LastError::None) };
    /// Whether `LAST_ERROR` may hold a message. Every call clears the
    /// message first; after a call that succeeded, the next one then reads
    /// this flag only (a slot without a destructor: no state to check,
    /// nothing to drop).
    static ERROR_HELD: Cell<bool> = const { Cell::new(false) };
}

fn set_last_error(error: LastError) {
    ERROR_HELD.set(!matches!(error, LastError::None));
    // `try_with`: during thread teardown the slot may be gone; then the
    // message is lost, never the process.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = error;
        }
    });
}

fn owned(text: &str) -> LastError {
    // Interior NULs would cut the message short in C; show them instead.
    let text = text.replace('\0', "\\0");
    LastError::Owned(CString::new(text).unwrap_or_default())
}

/// The pointer `barlink_last_error` returns: the thread's message, or "".
/// It stays valid until the thread's next barlink call.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| {
            let Ok(mut slot) = slot.try_borrow_mut() else {
                return c"".as_ptr();
            };
            if let LastError::TimedOut { function, after_ms } = *slot {
                *slot = owned(&format!("{function}: timed out after {after_ms} ms"));
            }
            match &*slot {
                LastError::None | LastError::TimedOut { .. } => c"".as_ptr(),
                LastError::Static(text) => text.as_ptr(),
                LastError::Owned(text) => text.as_ptr(),
            }
        })
        .unwrap_or(c"".as_ptr())
}

/// Runs the body of an exported function: clears the thread's last error,
/// catches any panic (which becomes `BARLINK_INTERNAL`), and turns an
/// `Err` into its status code with the message kept for the thread.
pub(crate) fn boundary(
    function: &'static str,
    body: impl FnOnce() -> Result<()>,
) -> barlink_status {
    if ERROR_HELD.get() {
        set_last_error(LastError::None);
    }
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => BARLINK_OK,
        Ok(Err(error)) => failed(function, error),
        Err(panic) => panicked(function, &*panic),
    }
}

/// Keeps a failed call's message for the thread; its status. Out of the
/// way of the calls' own code, which every message runs.
#[cold]
#[inline(never)]
fn failed(function: &'static str, error: Error) -> barlink_status {
    set_last_error(match error.message {
        Message::Static(text) => LastError::Static(text),
        Message::Owned(text) => owned(&format!("{function}: {text}")),
        Message::TimedOut { after_ms } => LastError::TimedOut { function, after_ms },
    });
    error.status
}

/// Keeps a panic's message for the thread: `BARLINK_INTERNAL`.
#[cold]
#[inline(never)]
fn panicked(function: &'static str, panic: &(dyn std::any::Any + Send)) -> barlink_status {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string());
    set_last_error(owned(&format!(
        "{function}: internal error (a bug in barlink, please report it): {detail}"
    )));
    BARLINK_INTERNAL
}
