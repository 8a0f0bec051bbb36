//! The interpreter's exit, for threads inside a barlink call.
//!
//! A call runs without the GIL and takes it back when it returns. Once
//! the interpreter has begun to finalize, CPython before 3.14 ends a
//! thread that takes the GIL back by unwinding it (`pthread_exit`), and
//! that unwinding meets the Rust frames of the call and aborts the
//! process ("exception not rethrown"): a daemon thread receiving in a
//! loop crashed every program that exited while it ran. So, on those
//! versions, importing the module registers an `atexit` handler; from the
//! moment it runs, a call that returns in any thread but the exiting one
//! parks that thread until the process ends, as CPython 3.14 parks such
//! threads itself (at finalization proper, a little later than here:
//! `atexit` runs the handlers registered before the module's import after
//! this one).
#![deny(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyCFunction;

/// Set where the handler is registered (before 3.14): calls count
/// themselves as they end only then.
static WATCHED: AtomicBool = AtomicBool::new(false);
/// Set by the `atexit` handler: calls that end from now on park.
static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread that runs the exit, which goes on.
static EXIT_THREAD: OnceLock<ThreadId> = OnceLock::new();
/// Threads between a call's end, where they found no exit marked, and
/// the GIL taken back: the handler lets them through before it returns.
static RETURNING: AtomicUsize = AtomicUsize::new(0);

/// How long the handler waits for calls that ended before the mark to
/// take the GIL back: each needs a moment, unless the machine stalls.
const RETURNING_WAIT: Duration = Duration::from_secs(1);

/// Registers the handler that marks the interpreter's exit, where CPython
/// would otherwise end a returning call's thread by unwinding it.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    if py.version_info() >= (3, 14) {
        return Ok(());
    }
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
    WATCHED.store(true, Relaxed);
    Ok(())
}

/// Marks the exit, then lets the GIL go until every call that ended
/// before the mark has taken it back, while the interpreter still lets
/// it. `RETURNING` is raised before the mark is read and `EXITING` set
/// before `RETURNING` is read, both in one total order (`SeqCst`): a call
/// either sees the mark and parks, or is counted here and waited for.
fn interpreter_exits(py: Python<'_>) {
    let _ = EXIT_THREAD.set(thread::current().id());
    EXITING.store(true, SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + RETURNING_WAIT;
        while RETURNING.load(SeqCst) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_micros(100));
        }
    });
}

/// Runs `f` without the GIL, as [`Python::detach`] does; a call that
/// ends after the interpreter began to exit, by returning or by a panic,
/// parks its thread rather than take the GIL back (the thread that runs
/// the exit goes on). Whatever the caller holds across this call, a Rust
/// lock or a Python one, stays held by a parked thread: nothing the exit
/// runs may wait for it.
pub(crate) fn detached<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    // Set once at import, before any call: where CPython parks such
    // threads itself, a call is a plain `detach`.
    if !WATCHED.load(Relaxed) {
        return py.detach(f);
    }
    let _returned = GilBack;
    py.detach(|| {
        let _end = CallEnd;
        f()
    })
}

/// Dropped where a call's GIL-free part ends: counts the thread as
/// returning, or parks it if the exit is marked.
struct CallEnd;

impl Drop for CallEnd {
    fn drop(&mut self) {
        RETURNING.fetch_add(1, SeqCst);
        if EXITING.load(SeqCst) && EXIT_THREAD.get() != Some(&thread::current().id()) {
            RETURNING.fetch_sub(1, SeqCst);
            loop {
                thread::park();
            }
        }
    }
}

/// Dropped once the GIL is back (or the call unwound past it): the
/// thread no longer counts as returning.
struct GilBack;

impl Drop for GilBack {
    fn drop(&mut self) {
        RETURNING.fetch_sub(1, SeqCst);
    }
}
