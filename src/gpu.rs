//! Device memory as a link's message source and destination.
//!
//! The route built today is the **staged host bounce**: the sender's copy
//! engine moves a device range into pinned host memory ([`StagingPool`],
//! [`Staged`]), and the link's fused copy+CRC moves it into the peer's
//! slots; the receiver checks every packet's CRC as it copies the message
//! out of its ring, and its copy engine moves the message into the device
//! buffer ([`recv_into_device`]). No SM is used. The direct routes — the
//! copy engine writing straight into registered ring slots, and rings in a
//! GPU's BAR1 — come next, measured against this one on a GPU
//! (`docs/GPU.md`).
//!
//! Everything here needs the CUDA driver, loaded at run time
//! ([`Cuda::load`]); without it the calls return [`CudaError::NoDriver`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use barlink_cuda::{
    Attribute, Context, Cuda, CudaError, Device, DeviceBuffer, DeviceInfo, DriverVersion,
    IpcHandle, PinnedBuffer,
};
use barlink_transport::link::IoError;
use barlink_transport::{Delivery, RecvTarget};

use crate::Connection;

/// Pinned host buffers kept for staging device ranges, reused once the
/// peer acknowledged what was staged in them (allocating pinned memory
/// takes the driver milliseconds). The pool holds at most its budget of
/// pinned memory, staged and spare together (or one buffer, for a message
/// larger than the budget): [`send_from_device`] waits for the peer's
/// acknowledgements rather than pin more, and spares of other sizes are
/// freed to make room. A pool serves one link: only that link's
/// acknowledgements return its buffers.
#[derive(Debug)]
pub struct StagingPool {
    context: Context,
    spares: Mutex<Vec<PinnedBuffer>>,
    /// Bytes of the buffers out on a link (staged, not yet acknowledged).
    staged: AtomicUsize,
    /// How many buffers are out on a link.
    staged_buffers: AtomicUsize,
    budget_bytes: usize,
}

/// A device range staged in pinned host memory: the message type of a
/// [`Connection<Staged>`]. Dropped (when the peer acknowledged it), its
/// buffer goes back to the pool.
#[derive(Debug)]
pub struct Staged {
    buffer: Option<PinnedBuffer>,
    len: usize,
    pool: Arc<StagingPool>,
}

/// The smallest pinned buffer the pool allocates.
const MIN_STAGING: usize = 4096;

/// The most buffers out on a link at once: small messages would
/// otherwise each pin a buffer of their own up to the byte budget (each
/// allocation a driver call of its own), far past what keeps a link's
/// window full.
const MAX_STAGED_BUFFERS: usize = 256;

/// Copies between device and host run in pieces of this many bytes, the
/// link driven between them: a copy of a large message in one piece
/// would leave the link's window idle for as long as the copy takes.
const COPY_PIECE: usize = 1 << 20;

impl StagingPool {
    /// A pool in `context` that pins at most `budget_bytes` (staged and
    /// spare), or one message's buffer when a message is larger (64 MiB
    /// keeps a link's window of 1 MiB messages in flight).
    pub fn new(context: Context, budget_bytes: usize) -> Arc<StagingPool> {
        Arc::new(StagingPool {
            context,
            spares: Mutex::new(Vec::new()),
            staged: AtomicUsize::new(0),
            staged_buffers: AtomicUsize::new(0),
            budget_bytes,
        })
    }

    /// Copies `len` bytes of `source` at `offset` into a pinned buffer (a
    /// copy-engine transfer that has finished when this returns).
    pub fn stage(
        self: &Arc<Self>,
        source: &DeviceBuffer,
        offset: usize,
        len: usize,
    ) -> Result<Staged, CudaError> {
        self.stage_between(source, offset, len, || {})
    }

    /// [`StagingPool::stage`], calling `between` between pieces of the
    /// copy (to drive a link that would otherwise stall meanwhile).
    fn stage_between(
        self: &Arc<Self>,
        source: &DeviceBuffer,
        offset: usize,
        len: usize,
        mut between: impl FnMut(),
    ) -> Result<Staged, CudaError> {
        let mut buffer = self.take(len)?;
        for start in (0..len).step_by(COPY_PIECE) {
            if start > 0 {
                between();
            }
            let end = len.min(start + COPY_PIECE);
            if let Err(error) = source.read(offset + start, &mut buffer.as_mut()[start..end]) {
                self.give_back(buffer);
                return Err(error);
            }
        }
        self.staged
            .fetch_add(buffer.as_ref().len(), Ordering::Relaxed);
        self.staged_buffers.fetch_add(1, Ordering::Relaxed);
        Ok(Staged {
            buffer: Some(buffer),
            len,
            pool: Arc::clone(self),
        })
    }

    /// Bytes of pinned buffers out on a link now (staged, not yet
    /// acknowledged by the peer).
    pub fn staged_bytes(&self) -> usize {
        self.staged.load(Ordering::Relaxed)
    }

    /// Whether staging `len` more bytes would pass the budget while
    /// staged buffers are out (which the peer's acknowledgements return).
    fn over_budget(&self, len: usize) -> bool {
        let staged = self.staged_bytes();
        staged > 0
            && (staged + capacity_for(len) > self.budget_bytes
                || self.staged_buffers.load(Ordering::Relaxed) >= MAX_STAGED_BUFFERS)
    }

    /// Bytes held in spare buffers now.
    pub fn spare_bytes(&self) -> usize {
        let spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        spares.iter().map(|b| b.as_ref().len()).sum()
    }

    /// A buffer of `len`'s size class: a spare of that size, or a new one
    /// once spares of other sizes were freed to keep the budget.
    fn take(&self, len: usize) -> Result<PinnedBuffer, CudaError> {
        let capacity = capacity_for(len);
        let mut evicted = Vec::new();
        {
            let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = spares.iter().position(|b| b.as_ref().len() == capacity) {
                return Ok(spares.swap_remove(i));
            }
            let mut held: usize = spares.iter().map(|b| b.as_ref().len()).sum();
            while held + self.staged_bytes() + capacity > self.budget_bytes {
                let Some(spare) = spares.pop() else { break };
                held -= spare.as_ref().len();
                evicted.push(spare);
            }
        }
        // Freed outside the lock: freeing pinned memory takes the driver a while.
        drop(evicted);
        self.context.alloc_pinned(capacity)
    }

    fn give_back(&self, buffer: PinnedBuffer) {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = spares.iter().map(|b| b.as_ref().len()).sum();
        if held + self.staged_bytes() + buffer.as_ref().len() <= self.budget_bytes {
            spares.push(buffer);
        }
    }
}

/// The size of the pinned buffer the pool allocates for `len` bytes.
fn capacity_for(len: usize) -> usize {
    len.max(MIN_STAGING)
        .checked_next_power_of_two()
        .unwrap_or(len)
}

impl AsRef<[u8]> for Staged {
    fn as_ref(&self) -> &[u8] {
        match &self.buffer {
            Some(buffer) => &buffer.as_ref()[..self.len],
            None => &[],
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.pool
                .staged
                .fetch_sub(buffer.as_ref().len(), Ordering::Relaxed);
            self.pool.staged_buffers.fetch_sub(1, Ordering::Relaxed);
            self.pool.give_back(buffer);
        }
    }
}

/// Why a device send did not go.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceSendError {
    /// Staging the device range failed (nothing was queued).
    Cuda(CudaError),
    /// The link refused or timed out (nothing was queued).
    Link(IoError),
}

impl std::fmt::Display for DeviceSendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSendError::Cuda(e) => write!(f, "staging the device range: {e}"),
            DeviceSendError::Link(e) => write!(f, "sending the staged message: {e}"),
        }
    }
}

impl std::error::Error for DeviceSendError {}

/// Sends `len` bytes of `source` at `offset` as one message, waiting at
/// most `timeout` in all for the pool's budget (the peer acknowledging
/// earlier messages) and for room on the link.
pub fn send_from_device(
    link: &mut Connection<Staged>,
    pool: &Arc<StagingPool>,
    source: &DeviceBuffer,
    offset: usize,
    len: usize,
    timeout: Duration,
) -> Result<(), DeviceSendError> {
    let started = Instant::now();
    let mut fresh = true;
    while pool.over_budget(len) {
        link.progress_waiting(std::mem::take(&mut fresh), false)
            .and_then(|_| link.check_open())
            .map_err(DeviceSendError::Link)?;
        if started.elapsed() >= timeout {
            return Err(DeviceSendError::Link(IoError::Timeout { after: timeout }));
        }
    }
    let timeout = timeout.saturating_sub(started.elapsed());
    // A failed round of progress is recorded by the link, and the send
    // below reports it.
    let staged = pool
        .stage_between(source, offset, len, || {
            let _ = link.progress();
        })
        .map_err(DeviceSendError::Cuda)?;
    link.send(staged, timeout).map_err(DeviceSendError::Link)
}

/// Why a device receive did not land; a message that arrived is handed
/// back in the error, never lost.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceRecvError {
    /// Nothing arrived, or the link failed.
    Link(IoError),
    /// The message is larger than the room at the offset.
    TooLarge {
        /// The message, checked and intact.
        message: Vec<u8>,
        /// Bytes of room from the offset to the buffer's end.
        room: usize,
    },
    /// The copy into the device failed.
    Cuda {
        /// The driver's error.
        error: CudaError,
        /// The message, checked and intact.
        message: Vec<u8>,
    },
    /// Allocating the pinned buffers to land messages in failed; no
    /// message was taken from the link.
    Pinning(CudaError),
}

impl std::fmt::Display for DeviceRecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceRecvError::Link(e) => write!(f, "receiving: {e}"),
            DeviceRecvError::Pinning(e) => write!(
                f,
                "allocating pinned buffers to land messages in: {e} (no message was taken)"
            ),
            DeviceRecvError::TooLarge { message, room } => write!(
                f,
                "a {} byte message does not fit the {room} bytes of the device buffer \
                 from the offset (the message is returned with this error)",
                message.len()
            ),
            DeviceRecvError::Cuda { error, .. } => write!(
                f,
                "copying the received message into the device: {error} \
                 (the message is returned with this error)"
            ),
        }
    }
}

impl std::error::Error for DeviceRecvError {}

/// Receives the next message into `destination` at `offset`, waiting at
/// most `timeout`; its length. The message's packets were CRC-checked as
/// they were copied out of the ring; the copy engine moves it to the
/// device.
pub fn recv_into_device<B: AsRef<[u8]>>(
    link: &mut Connection<B>,
    destination: &DeviceBuffer,
    offset: usize,
    timeout: Duration,
) -> Result<usize, DeviceRecvError> {
    let message = link.recv(timeout).map_err(DeviceRecvError::Link)?;
    let room = destination.len().saturating_sub(offset);
    if message.len() > room {
        return Err(DeviceRecvError::TooLarge { message, room });
    }
    if let Err(error) = write_between(link, destination, offset, &message) {
        return Err(DeviceRecvError::Cuda { error, message });
    }
    let len = message.len();
    link.recycle(message);
    Ok(len)
}

/// Receives messages into device memory through pinned host buffers that
/// it keeps posted on the link: the link's checked copy out of its medium
/// lands in pinned memory, and the copy engine reads it from there at full
/// speed (from a pageable buffer the driver would stage it once more).
/// A message larger than `room`, or that began before a buffer was
/// posted, arrives in a buffer of the link's and is copied from there.
/// A message taken with the link's own `recv` instead drops the buffer it
/// landed in; the next [`DeviceLanding::post`] or receive posts another.
#[derive(Debug)]
pub struct DeviceLanding {
    context: Context,
    room: usize,
    depth: usize,
    /// Its buffers alive: posted, holding a message, or being read.
    buffers: Arc<AtomicUsize>,
    landed: u64,
    copied: u64,
}

/// A pinned buffer lent to the link to land a message in.
struct PinnedTarget {
    buffer: PinnedBuffer,
    alive: Arc<AtomicUsize>,
}

impl Drop for PinnedTarget {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RecvTarget for PinnedTarget {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
}

impl DeviceLanding {
    /// Lands messages of up to `room` bytes in `depth` pinned buffers of
    /// `context`, posted by the first receive or post (two keep the link's copy
    /// of the next message beside the copy engine's of this one).
    pub fn new(context: Context, room: usize, depth: usize) -> DeviceLanding {
        DeviceLanding {
            context,
            room: room.max(1),
            depth: depth.max(1),
            buffers: Arc::new(AtomicUsize::new(0)),
            landed: 0,
            copied: 0,
        }
    }

    /// Messages received that landed in a pinned buffer, and messages
    /// that arrived in a buffer of the link's (pageable) instead.
    pub fn counts(&self) -> (u64, u64) {
        (self.landed, self.copied)
    }

    /// Posts pinned buffers on `link` until `depth` of them are out: a
    /// message that begins after this lands in one. A receive does it
    /// first; call it to have buffers posted before the next receive.
    pub fn post<B: AsRef<[u8]>>(
        &mut self,
        link: &mut Connection<B>,
    ) -> Result<(), DeviceRecvError> {
        while self.buffers.load(Ordering::Relaxed) < self.depth {
            let buffer = self
                .context
                .alloc_pinned(self.room)
                .map_err(DeviceRecvError::Pinning)?;
            self.buffers.fetch_add(1, Ordering::Relaxed);
            link.post_recv(Box::new(PinnedTarget {
                buffer,
                alive: Arc::clone(&self.buffers),
            }));
        }
        Ok(())
    }

    /// Receives the next message into `destination` at `offset`, waiting
    /// at most `timeout`; its length. Errors as [`recv_into_device`]'s.
    pub fn recv<B: AsRef<[u8]>>(
        &mut self,
        link: &mut Connection<B>,
        destination: &DeviceBuffer,
        offset: usize,
        timeout: Duration,
    ) -> Result<usize, DeviceRecvError> {
        self.post(link)?;
        let room = destination.len().saturating_sub(offset);
        match link.recv_delivery(timeout).map_err(DeviceRecvError::Link)? {
            Delivery::Message { data, .. } => {
                self.copied += 1;
                if data.len() > room {
                    return Err(DeviceRecvError::TooLarge {
                        message: data,
                        room,
                    });
                }
                if let Err(error) = write_between(link, destination, offset, &data) {
                    return Err(DeviceRecvError::Cuda {
                        error,
                        message: data,
                    });
                }
                let len = data.len();
                link.recycle(data);
                Ok(len)
            }
            Delivery::Landed { recv, len, .. } => {
                self.landed += 1;
                let mut target = recv.into_target();
                let landed = &target.bytes_mut()[..len];
                let result = if len > room {
                    Err(DeviceRecvError::TooLarge {
                        message: landed.to_vec(),
                        room,
                    })
                } else {
                    write_between(link, destination, offset, landed)
                        .map(|()| len)
                        .map_err(|error| DeviceRecvError::Cuda {
                            error,
                            message: landed.to_vec(),
                        })
                };
                // Posted again at once, still in order: the buffer is free
                // once the copy engine read it (`write` returns after).
                link.post_recv(target);
                result
            }
        }
    }
}

/// Writes `bytes` into `destination` at `offset` piece by piece, driving
/// `link` between the pieces (a failed round is recorded by the link and
/// reported by its next call).
fn write_between<B: AsRef<[u8]>>(
    link: &mut Connection<B>,
    destination: &DeviceBuffer,
    offset: usize,
    bytes: &[u8],
) -> Result<(), CudaError> {
    for (index, piece) in bytes.chunks(COPY_PIECE).enumerate() {
        if index > 0 {
            let _ = link.progress();
        }
        destination.write(offset + index * COPY_PIECE, piece)?;
    }
    Ok(())
}
