//! The paths as pipes: one trait over a barlink link (driven by the
//! caller or by its own progress thread), the raw rings and a Unix socket,
//! with the waits that keep every path moving while one is measured.

use std::collections::VecDeque;
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

/// How a link pipe hands its messages to the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sending {
    /// Another count of the shared buffer: the link may hold many.
    Shared,
    /// A copy of the bytes made for each message (a caller that only
    /// borrows them).
    Copied,
    /// The shared buffer, sent again only once the link let go of it (the
    /// message acknowledged): a caller that refills one buffer for every
    /// message, as a blocking C `barlink_send` lets its caller do (that
    /// call returns with its last packets copied rather than awaited).
    Acked,
}

/// A barlink link as a pipe.
struct LinkPipe<L: DrivenLink> {
    link: L,
    /// Each message goes as a copy of its bytes made for it, not as another
    /// count of the shared buffer ([`Sending::Copied`]).
    copies: Option<Copies>,
    /// Each send returns once its message is acknowledged ([`Sending::Acked`]).
    awaits_each: bool,
}

impl<L: DrivenLink> Pipe for LinkPipe<L> {
    fn send(&mut self, message: &Arc<[u8]>) -> Result<(), String> {
        let data = match &mut self.copies {
            Some(copies) => copies.copy_of(message),
            None => message.clone(),
        };
        self.link
            .send_blocking(data, STEP_TIMEOUT)
            .map_err(|e| e.to_string())?;
        if self.awaits_each {
            self.link.flush(STEP_TIMEOUT).map_err(|e| e.to_string())?;
        }
        Ok(())
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

/// The buffers a copying pipe copies messages into, each reused once the
/// link has let go of it, the most recently let go first (as the C face
/// takes its newest spare: the likeliest still in cache), so that a
/// message costs its copy, not an allocation and fresh pages.
#[derive(Default)]
struct Copies {
    /// Copies the link may still hold, oldest first (it lets go of them in
    /// that order).
    sent: VecDeque<Arc<[u8]>>,
    /// Copies it let go of, the most recent last.
    spares: Vec<Arc<[u8]>>,
}

impl Copies {
    /// At most as many buffers, and bytes in all, as the C face keeps
    /// spares.
    const MAX_KEPT: usize = 64;
    const MAX_KEPT_BYTES: usize = 64 << 20;

    /// A copy of `message`, in the spare the link let go of last if there
    /// is one.
    fn copy_of(&mut self, message: &[u8]) -> Arc<[u8]> {
        if self
            .sent
            .front()
            .or(self.spares.last())
            .is_some_and(|kept| kept.len() != message.len())
        {
            self.sent.clear();
            self.spares.clear();
        }
        while self.sent.front().is_some_and(|s| Arc::strong_count(s) == 1) {
            self.spares.extend(self.sent.pop_front());
        }
        let copy = match self.spares.pop() {
            Some(mut spare) => match Arc::get_mut(&mut spare) {
                Some(bytes) => {
                    bytes.copy_from_slice(message);
                    spare
                }
                None => Arc::from(message),
            },
            None => Arc::from(message),
        };
        let kept = self.sent.len() + self.spares.len();
        if kept < Self::MAX_KEPT && (kept + 1) * message.len() <= Self::MAX_KEPT_BYTES {
            self.sent.push_back(copy.clone());
        }
        copy
    }
}

/// Retransmissions and rejected packets, as the "done" message carries them.
fn counters(stats: &barlink_transport::Stats) -> (u64, u64) {
    (stats.retransmits(), stats.crc_failures + stats.malformed)
}

/// The link as a pipe, driven as `mode` says, handing it messages as
/// `sending` says.
pub(super) fn link_pipe<W: Window + Send + 'static>(
    link: RingLink<W, Arc<[u8]>>,
    mode: ProgressMode,
    sending: Sending,
) -> Result<Box<dyn Pipe>, String> {
    let copies = (sending == Sending::Copied).then(Copies::default);
    let awaits_each = sending == Sending::Acked;
    Ok(match mode {
        ProgressMode::Poll => Box::new(LinkPipe {
            link,
            copies,
            awaits_each,
        }),
        ProgressMode::Thread => Box::new(LinkPipe {
            link: ProgressThread::spawn(link, ProgressOptions::default())
                .map_err(|e| format!("starting the progress thread: {e}"))?,
            copies,
            awaits_each,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_new_bytes_and_spares_come_back_once_let_go() {
        let message: Arc<[u8]> = Arc::from(&[7u8; 256][..]);
        let mut copies = Copies::default();
        let first = copies.copy_of(&message);
        assert!(!Arc::ptr_eq(&first, &message), "a copy, not another count");
        assert_eq!(&first[..], &message[..]);
        // Still held (by the link): the next message needs a buffer of its own.
        let second = copies.copy_of(&message);
        assert!(!Arc::ptr_eq(&first, &second));
        // Let go of: its buffer takes the next copy.
        let first_at = Arc::as_ptr(&first);
        drop(first);
        let third = copies.copy_of(&[9u8; 256]);
        assert_eq!(Arc::as_ptr(&third), first_at);
        assert_eq!(&third[..], &[9u8; 256][..]);
        // Let go of in the order they were sent (as a link does), the
        // last one's buffer comes first, then the one before it.
        let second_at = Arc::as_ptr(&second);
        drop(second);
        drop(third);
        let fourth = copies.copy_of(&message);
        assert_eq!(Arc::as_ptr(&fourth), first_at);
        assert_eq!(Arc::as_ptr(&copies.copy_of(&message)), second_at);
        drop(fourth);
        // Another size: new buffers.
        let other = copies.copy_of(&[1u8; 64]);
        assert_eq!(other.len(), 64);
        assert_eq!(copies.sent.len() + copies.spares.len(), 1);
    }

    /// An acked pipe's send returns only once the link let go of the
    /// buffer (its message acknowledged), so the caller may refill it; the
    /// peer gets every message.
    #[test]
    fn an_acked_send_returns_once_the_link_let_go_of_its_buffer() {
        use barlink_transport::link::{LinkConfig, Listener, connect};
        const MESSAGES: usize = 6;
        let name = format!("bench-pipes-acked-{}", std::process::id());
        let listener = Listener::bind(&name).expect("a local name");
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let receiver = std::thread::spawn(move || {
            let link = connect(&name, &LinkConfig::default()).expect("connects");
            let mut pipe = link_pipe(link, ProgressMode::Poll, Sending::Shared).unwrap();
            let mut buf = Vec::new();
            let lens: Vec<_> = (0..MESSAGES)
                .map(|_| pipe.recv_within(&mut buf, STEP_TIMEOUT).unwrap())
                .collect();
            // "Got them", which carries the last message's acknowledgement;
            // the link stays up until the sender has read it.
            pipe.send(&Arc::from(&[1u8][..])).unwrap();
            let _ = finished.recv_timeout(STEP_TIMEOUT);
            lens
        });
        let link = listener.accept(&LinkConfig::default()).expect("accepts");
        let mut pipe = link_pipe(link, ProgressMode::Poll, Sending::Acked).unwrap();
        let message: Arc<[u8]> = Arc::from(vec![5u8; 700_000]);
        for sent in 1..=MESSAGES {
            pipe.send(&message).unwrap();
            assert_eq!(
                Arc::strong_count(&message),
                1,
                "message {sent}: the link still holds the buffer"
            );
        }
        let mut buf = Vec::new();
        assert_eq!(pipe.recv_within(&mut buf, STEP_TIMEOUT).unwrap(), Some(1));
        done.send(()).unwrap();
        assert_eq!(receiver.join().unwrap(), vec![Some(700_000); MESSAGES]);
    }

    #[test]
    fn the_kept_copies_stay_within_their_count_and_bytes() {
        let mut copies = Copies::default();
        let held: Vec<_> = (0..Copies::MAX_KEPT + 8)
            .map(|_| copies.copy_of(&[3u8; 32]))
            .collect();
        assert_eq!(copies.sent.len(), Copies::MAX_KEPT);
        assert!(held.iter().all(|h| h[..] == [3u8; 32]));
        // Let go of, they are kept as spares, still within the count.
        drop(held);
        let _again = copies.copy_of(&[4u8; 32]);
        assert_eq!(copies.sent.len() + copies.spares.len(), Copies::MAX_KEPT);
        // Large copies: no more than their bytes' limit.
        let large = vec![5u8; 16 << 20];
        let held: Vec<_> = (0..8).map(|_| copies.copy_of(&large)).collect();
        let kept = copies.sent.len() + copies.spares.len();
        assert_eq!(kept * large.len(), Copies::MAX_KEPT_BYTES);
        assert!(held.iter().all(|h| h[..] == large[..]));
    }
}
