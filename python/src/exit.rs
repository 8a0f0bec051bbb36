//! The interpreter's exit, for threads inside a barlink call.
//!
//! A call runs without the GIL and takes it back when it returns. Once
//! the interpreter has begun to finalize, CPython before 3.14 ends a
//! thread that takes the GIL back by unwinding it (`pthread_exit`), and
//! that unwinding meets the Rust frames of the call and aborts the
//! process ("exception not rethrown"): a daemon thread receiving in a
//! loop crashed every program that exited while it ran. So the module
//! registers an `atexit` handler, which runs after every thread that is
//! not a daemon has been joined and after the program's own handlers,
//! just before finalization; from then on a call that returns in any
//! other thread parks that thread until the process ends, as CPython
//! 3.14 itself parks such threads.
#![deny(unsafe_code)]

use std::sync::OnceLock;
use std::thread::{self, ThreadId};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyCFunction;

/// The thread that runs the interpreter's exit: set once it began.
static EXITING: OnceLock<ThreadId> = OnceLock::new();

/// Registers the handler that marks the interpreter's exit.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let on_exit = PyCFunction::new_closure(
        py,
        Some(c"_barlink_interpreter_exits"),
        Some(c"Marks the interpreter's exit for barlink's calls in other threads."),
        |args, _kwargs| -> PyResult<()> {
            interpreter_exits(args.py());
            Ok(())
        },
    )?;
    py.import("atexit")?.call_method1("register", (on_exit,))?;
    Ok(())
}

/// Marks the exit, then lets the GIL go a moment: a thread whose call
/// returned just before, and that waits for the GIL, takes it while the
/// interpreter still lets it, and parks at its next call's end.
fn interpreter_exits(py: Python<'_>) {
    let _ = EXITING.set(thread::current().id());
    py.detach(|| thread::sleep(Duration::from_millis(2)));
}

/// Runs `f` without the GIL, as [`Python::detach`] does; a call that
/// ends after the interpreter began to exit parks its thread rather than
/// take the GIL back (the thread that runs the exit goes on). A lock the
/// caller holds across this call stays held by a parked thread: no code
/// the exit runs may need it.
pub(crate) fn detached<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    py.detach(|| {
        let result = f();
        park_if_exiting();
        result
    })
}

fn park_if_exiting() {
    if let Some(exit_thread) = EXITING.get()
        && *exit_thread != thread::current().id()
    {
        loop {
            thread::park();
        }
    }
}
