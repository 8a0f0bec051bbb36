//! The paths as pipes: one trait over a barlink link (driven by the
//! caller or by its own progress thread), the raw rings and a Unix socket,
//! with the waits that keep every path moving while one is measured.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use barlink_transport::link::{IoError, Medium, ProgressOptions, ProgressThread, RingLink};
use barlink_transport::window::Window;

use super::plan::{ProgressMode, STEP_TIMEOUT};

/// Moves messages one way and back.
pub(super) trait Pipe {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String>;
    /// Receives one message into `buf`: its length, or `None` if none came
    /// within `within`. Pipes that move data without being called (the raw
    /// ring, the socket) block instead, for at most [`STEP_TIMEOUT`].
    fn recv_within(&mut self, buf: &mut Vec<u8>, within: Duration)
    -> Result<Option<usize>, String>;
    /// Whether everything sent is through (for a link: acknowledged), after
    /// waiting at most `within`.
    fn flush_within(&mut self, within: Duration) -> Result<bool, String> {
        let _ = within;
        Ok(true)
    }
    /// One round of whatever keeps the pipe moving while its turn waits.
    fn poke(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn counters(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// A link call's result, with a timeout as `None` (the wait goes on in
/// [`recv_on`] / [`flush_on`]).
fn unless_timed_out<T>(result: Result<T, IoError>) -> Result<Option<T>, String> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(IoError::Timeout { .. }) => Ok(None),
        Err(error) => Err(error.to_string()),
    }
}

/// How long one wait on a pipe lasts before the other pipes get a round.
const IDLE_SLICE: Duration = Duration::from_millis(1);

/// Receives on `pipes[index]`, giving the other pipes a round of progress
/// whenever the wait lasts longer than [`IDLE_SLICE`].
///
/// A link moves data only while it is called. The two processes take the
/// paths in turn, so a packet that one side still owes on the path it left
/// (a held acknowledgement, a retransmission of a last packet that arrived
/// corrupt) would otherwise wait until the schedule came back to that path
/// — while the other side waits for it there, never coming back: a
/// deadlock that `--fault-rate` runs hit. A round
/// on an idle link is two loads, so the timed windows do not feel it.
pub(super) fn recv_on(
    pipes: &mut [Box<dyn Pipe>],
    index: usize,
    buf: &mut Vec<u8>,
) -> Result<usize, String> {
    let mut deadline = None;
    loop {
        if let Some(len) = pipes[index].recv_within(buf, IDLE_SLICE)? {
            return Ok(len);
        }
        keep_others_moving(pipes, index, &mut deadline)?;
    }
}

/// Flushes `pipes[index]` as [`recv_on`] receives: before the schedule
/// turns to another path, everything sent on this one is acknowledged.
pub(super) fn flush_on(pipes: &mut [Box<dyn Pipe>], index: usize) -> Result<(), String> {
    let mut deadline = None;
    while !pipes[index].flush_within(IDLE_SLICE)? {
        keep_others_moving(pipes, index, &mut deadline)?;
    }
    Ok(())
}

/// A round of progress on every pipe but `index`; an error once the wait
/// on `index` has lasted [`STEP_TIMEOUT`].
fn keep_others_moving(
    pipes: &mut [Box<dyn Pipe>],
    index: usize,
    deadline: &mut Option<Instant>,
) -> Result<(), String> {
    let now = Instant::now();
    if now > *deadline.get_or_insert(now + STEP_TIMEOUT) {
        return Err(format!("timed out after {STEP_TIMEOUT:?}"));
    }
    for (other, pipe) in pipes.iter_mut().enumerate() {
        if other != index {
            pipe.poke()?;
        }
    }
    Ok(())
}

/// A barlink link as the pipes use it, whoever drives its progress: the
/// caller's thread ([`RingLink`]) or a progress thread of its own.
trait DrivenLink {
    fn send_blocking(&mut self, data: Arc<[u8]>, timeout: Duration) -> Result<(), IoError>;
    fn recv_into(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, IoError>;
    fn flush(&mut self, timeout: Duration) -> Result<(), IoError>;
    /// One round of progress, where the caller drives it.
    fn poke(&mut self) -> Result<(), IoError>;
    fn stats(&self) -> barlink_transport::Stats;
}

impl<W: Window> DrivenLink for RingLink<W, Arc<[u8]>> {
    fn send_blocking(&mut self, data: Arc<[u8]>, timeout: Duration) -> Result<(), IoError> {
        RingLink::send_blocking(self, data, timeout).map(drop)
    }
    fn recv_into(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, IoError> {
        RingLink::recv_into(self, buf, timeout)
    }
    fn flush(&mut self, timeout: Duration) -> Result<(), IoError> {
        RingLink::flush(self, timeout)
    }
    fn poke(&mut self) -> Result<(), IoError> {
        self.progress().map(drop)
    }
    fn stats(&self) -> barlink_transport::Stats {
        self.engine().stats().clone()
    }
}

impl<M: Medium + Send + 'static> DrivenLink for ProgressThread<M, Arc<[u8]>> {
    fn send_blocking(&mut self, data: Arc<[u8]>, timeout: Duration) -> Result<(), IoError> {
        ProgressThread::send_blocking(self, data, timeout).map(drop)
    }
    fn recv_into(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, IoError> {
        ProgressThread::recv_into(self, buf, timeout)
    }
    fn flush(&mut self, timeout: Duration) -> Result<(), IoError> {
        ProgressThread::flush(self, timeout)
    }
    /// Its own thread drives it.
    fn poke(&mut self) -> Result<(), IoError> {
        Ok(())
    }
    fn stats(&self) -> barlink_transport::Stats {
        ProgressThread::stats(self)
    }
}

/// A barlink link as a pipe.
struct LinkPipe<L: DrivenLink> {
    link: L,
    /// Each message goes as a copy of its bytes made for it (a caller that
    /// only borrows them), not as another count of the shared buffer.
    copies: bool,
}

impl<L: DrivenLink> Pipe for LinkPipe<L> {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String> {
        let data = if self.copies {
            Arc::from(&message[..])
        } else {
            message.clone()
        };
        self.link
            .send_blocking(data, STEP_TIMEOUT)
            .map_err(|e| e.to_string())
    }
    fn recv_within(
        &mut self,
        buf: &mut Vec<u8>,
        within: Duration,
    ) -> Result<Option<usize>, String> {
        // Into the caller's buffer, as the raw ring receives: a stream of
        // large messages keeps landing in the same memory.
        unless_timed_out(self.link.recv_into(buf, within))
    }
    fn flush_within(&mut self, within: Duration) -> Result<bool, String> {
        Ok(unless_timed_out(self.link.flush(within))?.is_some())
    }
    fn poke(&mut self) -> Result<(), String> {
        self.link.poke().map_err(|e| e.to_string())
    }
    fn counters(&self) -> (u64, u64) {
        counters(&self.link.stats())
    }
}

/// Retransmissions and rejected packets, as the "done" message carries them.
fn counters(stats: &barlink_transport::Stats) -> (u64, u64) {
    (stats.retransmits(), stats.crc_failures + stats.malformed)
}

/// The link as a pipe, driven as `mode` says; `copies`: each message sent
/// as a copy made for it.
pub(super) fn link_pipe<W: Window + Send + 'static>(
    link: RingLink<W, Arc<[u8]>>,
    mode: ProgressMode,
    copies: bool,
) -> Result<Box<dyn Pipe>, String> {
    Ok(match mode {
        ProgressMode::Poll => Box::new(LinkPipe { link, copies }),
        ProgressMode::Thread => Box::new(LinkPipe {
            link: ProgressThread::spawn(link, ProgressOptions::default())
                .map_err(|e| format!("starting the progress thread: {e}"))?,
            copies,
        }),
    })
}

pub(super) struct SocketPipe(pub(super) UnixStream);

impl Pipe for SocketPipe {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String> {
        self.0
            .write_all(&(message.len() as u64).to_le_bytes())
            .and_then(|()| self.0.write_all(message))
            .map_err(|e| e.to_string())
    }
    fn recv_within(&mut self, buf: &mut Vec<u8>, _: Duration) -> Result<Option<usize>, String> {
        let mut len = [0u8; 8];
        self.0.read_exact(&mut len).map_err(|e| e.to_string())?;
        let len = u64::from_le_bytes(len) as usize;
        if len > 1 << 31 {
            return Err(format!("unix socket: impossible length {len}"));
        }
        buf.resize(len, 0);
        self.0.read_exact(buf).map_err(|e| e.to_string())?;
        Ok(Some(len))
    }
}
