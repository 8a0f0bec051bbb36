//! A link driven by a background progress thread: the "SM-free" model, in
//! which a CPU thread (not the caller, and no GPU work) moves packets while
//! the caller computes.
//!
//! [`ProgressThread`] owns a [`Link`] behind a mutex. Its thread runs
//! rounds of [`Link::progress`] while packets move, spins a little when
//! idle, then parks for a short while; callers block on a condition
//! variable that the thread signals when a round delivered a message,
//! completed a send, freed queue room or failed. Every blocking call has a
//! timeout. On two busy cores a progress thread competes with the caller
//! for CPU: the caller-driven link ([`Link`] itself) is the faster choice
//! there, the thread the one that keeps links moving while the caller is
//! elsewhere.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{IoError, Link, Medium};
use crate::engine::{LinkError, MessageId, SendError, Stats};

/// How a progress thread waits when nothing moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressOptions {
    /// Idle rounds spent spinning before the thread starts parking: a busy
    /// link's next packet is usually less than a microsecond away.
    pub spin_rounds: u32,
    /// How long the thread parks per idle round after spinning. A caller's
    /// send wakes it at once; arrivals from the peer are seen at the latest
    /// this late.
    pub idle_park: Duration,
}

impl Default for ProgressOptions {
    fn default() -> Self {
        ProgressOptions {
            spin_rounds: 2_000,
            idle_park: Duration::from_micros(50),
        }
    }
}

struct Shared<M: Medium, B: AsRef<[u8]>> {
    link: Mutex<Link<M, B>>,
    /// Signalled after a round that changed what a caller may wait for.
    changed: Condvar,
    /// Callers inside a wait: the thread signals only when there are some.
    waiters: AtomicUsize,
    stop: AtomicBool,
    options: ProgressOptions,
}

/// A [`Link`] whose progress runs on a thread of its own. The calls mirror
/// the link's and take `&self`, so several threads may share one (behind
/// an `Arc`).
pub struct ProgressThread<M, B = Vec<u8>>
where
    M: Medium + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    shared: Arc<Shared<M, B>>,
    thread: Option<JoinHandle<()>>,
}

impl<M, B> std::fmt::Debug for ProgressThread<M, B>
where
    M: Medium + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressThread")
            .field("options", &self.shared.options)
            .field("running", &self.thread.is_some())
            .finish_non_exhaustive()
    }
}

/// What a caller waits for; the thread signals when any of it changes.
fn observed<M: Medium, B: AsRef<[u8]>>(link: &Link<M, B>) -> (u64, usize, usize, bool) {
    (
        link.completed,
        link.engine.messages_ready(),
        link.engine.queued_messages(),
        link.engine.is_closed(),
    )
}

fn run<M: Medium, B: AsRef<[u8]>>(shared: &Shared<M, B>) {
    let mut idle_rounds = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let (moved, changed, failed) = {
            let Ok(mut link) = shared.link.lock() else {
                break;
            };
            let before = observed(&link);
            match link.progress() {
                Ok(moved) => (moved, observed(&link) != before, false),
                Err(_) => (true, true, true),
            }
        };
        if changed && shared.waiters.load(Ordering::Acquire) > 0 {
            shared.changed.notify_all();
        }
        if failed {
            // The link keeps its error: every call returns it from now on.
            break;
        }
        if moved {
            idle_rounds = 0;
        } else {
            idle_rounds = idle_rounds.saturating_add(1);
            if idle_rounds < shared.options.spin_rounds {
                std::hint::spin_loop();
            } else {
                std::thread::park_timeout(shared.options.idle_park);
            }
        }
    }
    shared.changed.notify_all();
}

fn poisoned() -> IoError {
    IoError::Medium("the progress thread panicked while driving the link".to_string())
}

impl<M, B> ProgressThread<M, B>
where
    M: Medium + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    /// Starts a thread that drives `link` until [`ProgressThread::close`],
    /// [`ProgressThread::into_link`] or drop, or until the link fails.
    pub fn spawn(link: Link<M, B>, options: ProgressOptions) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            link: Mutex::new(link),
            changed: Condvar::new(),
            waiters: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            options,
        });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("barlink-progress".to_string())
            .spawn(move || run(&for_thread))?;
        Ok(ProgressThread {
            shared,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Link<M, B>>, IoError> {
        self.shared.link.lock().map_err(|_| poisoned())
    }

    /// Wakes the thread if it is parked: the caller gave it work.
    fn wake(&self) {
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }

    /// Holds the lock and waits until `done` returns `Some`, for at most
    /// `timeout`. `done` sees the link after every round of the thread.
    fn wait_until<R>(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&mut Link<M, B>) -> Result<Option<R>, IoError>,
    ) -> Result<R, IoError> {
        let deadline = Instant::now() + timeout;
        let mut link = self.lock()?;
        self.shared.waiters.fetch_add(1, Ordering::AcqRel);
        let result = loop {
            match done(&mut link) {
                Ok(Some(value)) => break Ok(value),
                Ok(None) => {}
                Err(error) => break Err(error),
            }
            if let Err(error) = link.check_open() {
                break Err(error);
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(IoError::Timeout { after: timeout });
            }
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                // No thread drives the link any more (it failed): one last
                // look, then the link's own verdict.
                break match link.check_open() {
                    Err(error) => Err(error),
                    Ok(()) => Err(IoError::Medium(
                        "the progress thread stopped driving the link".to_string(),
                    )),
                };
            }
            link = match self.shared.changed.wait_timeout(link, deadline - now) {
                Ok((guard, _)) => guard,
                Err(_) => {
                    self.shared.waiters.fetch_sub(1, Ordering::AcqRel);
                    return Err(poisoned());
                }
            };
        };
        self.shared.waiters.fetch_sub(1, Ordering::AcqRel);
        result
    }

    /// Queues a message without waiting; `Err(SendError::QueueFull)` gives
    /// the buffer back.
    pub fn send(&self, data: B) -> Result<MessageId, SendError<B>> {
        let result = match self.shared.link.lock() {
            Ok(mut link) => link.send(data),
            Err(_) => Err(SendError::Closed(data)),
        };
        self.wake();
        result
    }

    /// Queues a message, waiting at most `timeout` for room in the queue.
    pub fn send_blocking(&self, data: B, timeout: Duration) -> Result<MessageId, IoError> {
        let mut data = Some(data);
        let result = self.wait_until(timeout, |link| {
            let Some(buf) = data.take() else {
                return Ok(None);
            };
            match link.send(buf) {
                Ok(id) => Ok(Some(id)),
                Err(SendError::QueueFull(back)) => {
                    data = Some(back);
                    Ok(None)
                }
                Err(SendError::TooLong { len, max, .. }) => Err(IoError::TooLong { len, max }),
                Err(SendError::Closed(_)) => Err(IoError::Closed(
                    link.closed.clone().unwrap_or(LinkError::LocalClose),
                )),
            }
        });
        self.wake();
        result
    }

    /// The next delivered message, waiting at most `timeout`.
    pub fn recv(&self, timeout: Duration) -> Result<Vec<u8>, IoError> {
        let result = self.wait_until(timeout, |link| Ok(link.take_message()));
        // Taking a message frees credit the thread should pass on.
        self.wake();
        result
    }

    /// [`ProgressThread::recv`] into a buffer the caller reuses, as
    /// [`Link::recv_into`](super::Link::recv_into) receives. The thread's
    /// rounds read everything that arrived, so a message has usually
    /// begun in another buffer by the time the caller asks.
    pub fn recv_into(&self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, IoError> {
        if buf.capacity() > 0 {
            self.recycle(std::mem::take(buf));
        }
        *buf = self.recv(timeout)?;
        Ok(buf.len())
    }

    /// A delivered message if one is ready.
    pub fn try_recv(&self) -> Result<Option<Vec<u8>>, IoError> {
        let mut link = self.lock()?;
        if let Some(data) = link.take_message() {
            drop(link);
            self.wake();
            return Ok(Some(data));
        }
        link.check_open()?;
        Ok(None)
    }

    /// Gives a received message's buffer back for reuse.
    pub fn recycle(&self, buf: Vec<u8>) {
        if let Ok(mut link) = self.shared.link.lock() {
            link.recycle(buf);
        }
    }

    /// Waits until every queued message is acknowledged, at most `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<(), IoError> {
        self.wake();
        self.wait_until(timeout, |link| {
            Ok((link.engine.queued_messages() == 0).then_some(()))
        })
    }

    /// Messages whose every packet the peer acknowledged, so far.
    pub fn completed(&self) -> u64 {
        self.shared.link.lock().map_or(0, |link| link.completed())
    }

    /// A copy of the engine's statistics.
    pub fn stats(&self) -> Stats {
        self.shared
            .link
            .lock()
            .map_or_else(|_| Stats::default(), |link| link.engine().stats().clone())
    }

    /// Closes in order (queued messages are still delivered, then the peer
    /// is told), waiting at most `timeout`, and stops the thread.
    pub fn close(mut self, timeout: Duration) -> Result<(), IoError> {
        {
            let mut link = self.lock()?;
            link.quiet = None;
            link.engine.close();
        }
        self.wake();
        let result = self.wait_until(timeout, |link| {
            let now = link.now();
            Ok((link.engine.is_closed() && !link.engine.wants_transmit(now)).then_some(()))
        });
        self.stop();
        result
    }

    /// Stops the thread and gives the link back, to be driven by the caller.
    pub fn into_link(mut self) -> Result<Link<M, B>, IoError> {
        self.stop();
        let shared = self.shared.clone();
        drop(self);
        match Arc::try_unwrap(shared) {
            Ok(shared) => shared.link.into_inner().map_err(|_| poisoned()),
            Err(_) => Err(IoError::Medium(
                "the progress thread still holds the link".to_string(),
            )),
        }
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            // A panic in the thread poisons the mutex; calls report it.
            let _ = thread.join();
        }
    }
}

impl<M, B> Drop for ProgressThread<M, B>
where
    M: Medium + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    fn drop(&mut self) {
        self.stop();
    }
}
