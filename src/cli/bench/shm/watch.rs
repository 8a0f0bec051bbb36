//! The bench's two processes watch each other, so that neither waits out
//! its step timeouts for a peer that is gone.
//!
//! - The parent polls its child ([`PeerWatch`]). A child that ends with a
//!   failure before the run is over is a lost peer: the parent says which
//!   process, in which phase, and exits at once — 1 when a signal ended the
//!   child, else with the child's own status (it said why) — whatever step
//!   it was waiting in (a link set-up cannot be interrupted, so the
//!   watching thread ends the process itself).
//! - The child's stdin is a pipe whose other end only the parent holds: the
//!   lifeline. When the parent dies, the kernel closes that end, the child
//!   reads end-of-file and exits ([`watch_parent`]). No signal set-up is
//!   needed (`PR_SET_PDEATHSIG` would take `unsafe` here), and the child's
//!   links need not time out first.

use std::fmt;
use std::io::Read;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::plan::ProcPath;
use crate::cli::{Status, human_size};

/// How often the parent looks at its child.
const POLL: Duration = Duration::from_millis(10);
/// How long a failing parent waits to see whether its child died first
/// (then the failure is the lost peer, not what the parent's wait saw).
const GRACE: Duration = Duration::from_millis(200);

/// Where the parent is in the schedule, for the report of a lost peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Starting,
    SettingUp(ProcPath),
    Window {
        size: usize,
        window: usize,
        windows: usize,
        path: ProcPath,
    },
    Latency {
        size: usize,
        path: ProcPath,
    },
    Flushing {
        size: usize,
    },
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Phase::Starting => f.write_str("its start"),
            Phase::SettingUp(path) => write!(f, "the set-up of {}", path.name()),
            Phase::Window {
                size,
                window: 0,
                path,
                ..
            } => write!(
                f,
                "size {}, the warm-up on {}",
                human_size(size),
                path.name()
            ),
            Phase::Window {
                size,
                window,
                windows,
                path,
            } => write!(
                f,
                "size {}, window {window} of {windows} on {}",
                human_size(size),
                path.name()
            ),
            Phase::Latency { size, path } => {
                write!(f, "size {}, latency on {}", human_size(size), path.name())
            }
            Phase::Flushing { size } => {
                write!(f, "size {}, the last acknowledgements", human_size(size))
            }
        }
    }
}

/// The child ended while the run needed it.
#[derive(Debug)]
pub struct LostPeer {
    pid: u32,
    phase: Phase,
    status: ExitStatus,
}

impl LostPeer {
    /// The status the bench ends with: 1 where a signal ended the peer,
    /// else the peer's own (the same binary, the same convention).
    pub fn status(&self) -> Status {
        match self.status.code() {
            Some(2) => Status::Usage,
            Some(3) => Status::Environment,
            _ => Status::CheckFailed,
        }
    }
}

impl fmt::Display for LostPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lost the peer process (bench-peer, pid {}) during {}: it ended with {}",
            self.pid, self.phase, self.status
        )
    }
}

/// The run goes on; the watcher reports a loss.
const RUNNING: u8 = 0;
/// The watcher found the child gone and is ending the process.
const LOST: u8 = 1;
/// The parent is finishing (or failing): the child's end is expected.
const STOPPING: u8 = 2;

struct Shared {
    child: Mutex<Child>,
    phase: Mutex<Phase>,
    state: AtomicU8,
}

/// The parent's watch over its child.
pub struct PeerWatch {
    shared: Arc<Shared>,
    pid: u32,
    /// The lifeline: dropping it tells the child to stop.
    lifeline: Option<ChildStdin>,
    watcher: Option<JoinHandle<()>>,
}

impl PeerWatch {
    /// Starts `command` as the child, with its lifeline, and watches it.
    pub fn spawn(mut command: Command) -> Result<PeerWatch, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the peer process: {e}"))?;
        let lifeline = child.stdin.take();
        let pid = child.id();
        let shared = Arc::new(Shared {
            child: Mutex::new(child),
            phase: Mutex::new(Phase::Starting),
            state: AtomicU8::new(RUNNING),
        });
        let watched = shared.clone();
        let watcher = thread::Builder::new()
            .name("bench-peer-watch".into())
            .spawn(move || watch_child(&watched, pid))
            .map_err(|e| format!("starting the peer's watch: {e}"))?;
        Ok(PeerWatch {
            shared,
            pid,
            lifeline,
            watcher: Some(watcher),
        })
    }

    /// Records where the run is.
    pub fn enter(&self, phase: Phase) {
        *lock(&self.shared.phase) = phase;
    }

    /// Whether the child is still running.
    pub fn peer_running(&self) -> bool {
        matches!(lock(&self.shared.child).try_wait(), Ok(None))
    }

    /// The run is over: waits for the child's own end (the lifeline stays
    /// up meanwhile) and returns how it ended.
    pub fn finish(mut self) -> Result<ExitStatus, String> {
        self.stop_watching();
        lock(&self.shared.child).wait().map_err(|e| e.to_string())
    }

    /// The run failed: the lost peer if the child died on its own first;
    /// otherwise the child is stopped (lifeline cut, then killed) and
    /// `None` returned.
    pub fn abort(mut self) -> Option<LostPeer> {
        self.stop_watching();
        let phase = *lock(&self.shared.phase);
        let deadline = Instant::now() + GRACE;
        let mut child = lock(&self.shared.child);
        loop {
            match child.try_wait() {
                Ok(Some(status)) if !status.success() => {
                    return Some(LostPeer {
                        pid: self.pid,
                        phase,
                        status,
                    });
                }
                Ok(Some(_)) => return None,
                Err(_) => break,
                Ok(None) if Instant::now() >= deadline => break,
                Ok(None) => thread::sleep(POLL / 2),
            }
        }
        self.lifeline = None;
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Takes the watcher off duty and waits for it. If it is already
    /// reporting a loss, that report ends the process: this never returns.
    fn stop_watching(&mut self) {
        let state = &self.shared.state;
        if state
            .compare_exchange(RUNNING, STOPPING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
            && state.load(Ordering::Acquire) == LOST
        {
            loop {
                thread::park();
            }
        }
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        self.shared.state.store(STOPPING, Ordering::Release);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The watching thread: polls the child until the parent stops watching;
/// a child that ends with a failure meanwhile is reported as lost, and the
/// process exits with status 1.
fn watch_child(shared: &Shared, pid: u32) {
    while shared.state.load(Ordering::Acquire) == RUNNING {
        let ended = lock(&shared.child).try_wait();
        match ended {
            // A child that ran its schedule to the end is not lost; the
            // parent's own steps say whether anything is missing.
            Ok(Some(status)) if status.success() => return,
            Ok(Some(status)) => {
                if shared
                    .state
                    .compare_exchange(RUNNING, LOST, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let lost = LostPeer {
                        pid,
                        phase: *lock(&shared.phase),
                        status,
                    };
                    // As main reports a failed command.
                    eprintln!("barlink: bench: {lost}");
                    std::process::exit(lost.status() as i32);
                }
                return;
            }
            Ok(None) => thread::sleep(POLL),
            Err(_) => return,
        }
    }
}

/// The child's side: ends this process when the parent's end of the
/// lifeline (stdin) closes, which happens when the parent dies.
pub fn watch_parent() {
    let parent = std::os::unix::process::parent_id();
    let spawned = thread::Builder::new()
        .name("bench-parent-watch".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 64];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            eprintln!(
                "barlink: bench peer: lost the parent process (pid {parent}): its lifeline closed"
            );
            std::process::exit(Status::CheckFailed as i32);
        });
    if let Err(e) = spawned {
        eprintln!("barlink: bench peer: cannot watch the parent process: {e}");
    }
}
